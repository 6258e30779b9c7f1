package zklock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// TLS from the URL: with the CA and a client certificate, the driver locks
// through a TLS port; a wrong CA or no client certificate fails Dial with
// the TLS error, not a bare timeout.
func TestTLSFromURL(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	certs := testenv.NewCerts(t, "zk.example")
	other := testenv.NewCerts(t, "zk.example")
	front := testenv.TLSFront(t, certs, servers[0])
	q := func(kv ...string) string {
		v := url.Values{"connect_timeout": {"2s"}, "session_timeout": {"4s"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	for _, c := range []struct {
		query string
		want  string // in the error; "" for success
	}{
		{q("ca", certs.CA, "cert", certs.ClientCert, "key", certs.ClientKey), ""},
		{q("ca", certs.CA, "cert", certs.ClientCert, "key", certs.ClientKey, "server_name", "zk.example"), ""},
		{q("ca", other.CA, "cert", certs.ClientCert, "key", certs.ClientKey), "certificate"},
		{q("ca", certs.CA), "certificate required"},
		{q("ca", certs.CA, "cert", certs.ClientCert, "key", certs.ClientKey, "server_name", "elsewhere.example"), "elsewhere.example"},
	} {
		u, err := url.Parse("zk://" + front + "/locker-test?" + c.query)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := Open(ctx, u.String())
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.query, err)
		case c.want == "":
			l := backend.Claim{Key: uniqueKey(t), Token: newToken(t), TTL: time.Second}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				t.Errorf("%s: TryAcquire: %v", c.query, err)
			}
			d.Close()
		case err == nil:
			d.Close()
			t.Errorf("%s: Open succeeded", c.query)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want an error that says %q", c.query, err, c.want)
		}
		cancel()
	}
}
