package etcdlock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// TLS from the URL: the CA and client certificate come from ca=, cert= and
// key=, and server_name= is checked although gRPC dials an address the
// certificate does not name; a wrong CA or name fails Open, saying why.
func TestTLSFromURL(t *testing.T) {
	endpoints := testenv.EtcdEndpoints()
	testenv.Require(t, endpoints...)
	t.Parallel()
	// The server certificate names etcd.example only, not 127.0.0.1.
	certs := testenv.NewCertsFor(t, "etcd.example")
	other := testenv.NewCertsFor(t, "etcd.example")
	front := testenv.TLSFront(t, certs, endpoints[0], "h2")
	q := func(kv ...string) string {
		v := url.Values{"dial_timeout": {"2s"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	client := []string{"ca", certs.CA, "cert", certs.ClientCert, "key", certs.ClientKey}
	for _, c := range []struct {
		query string
		want  string // in the error; "" for success
	}{
		{q(append(client, "server_name", "etcd.example")...), ""},
		{q(client...), "x509: cannot validate certificate for 127.0.0.1"}, // the address is not in the certificate
		{q(append(client, "server_name", "elsewhere.example")...), "x509: certificate is valid for etcd.example, not elsewhere.example"},
		{q("ca", other.CA, "cert", certs.ClientCert, "key", certs.ClientKey, "server_name", "etcd.example"), "x509: certificate signed by unknown authority"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := Open(ctx, "etcd://"+front+"/locker-test-tls?"+c.query)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.query, err)
		case c.want == "":
			l := backend.Claim{Key: "tls-" + t.Name(), Token: "tok-" + t.Name(), TTL: 2 * time.Second}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				t.Errorf("%s: TryAcquire: %v", c.query, err)
			} else if err := d.Release(ctx, l); err != nil {
				t.Errorf("%s: Release: %v", c.query, err)
			}
			d.Close()
		case err == nil:
			d.Close()
			t.Errorf("%s: Open succeeded", c.query)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v (want it to say %q)", c.query, err, c.want)
		}
		cancel()
	}
}
