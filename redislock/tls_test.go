package redislock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// TLS from the URL: the CA, the client certificate and the server's name
// come from ca=, cert=, key= and server_name=, for a single server and a
// quorum; a wrong CA, a missing client certificate or a wrong name are
// refused at Open, with the TLS error, within a second.
func TestTLSFromURL(t *testing.T) {
	t.Parallel()
	certs := testenv.NewCerts(t, "redis.example")
	other := testenv.NewCerts(t, "redis.example")
	_, addr := testenv.StartRedisTLS(t, certs)
	q := func(kv ...string) string {
		v := url.Values{"restart_delay": {"0"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	client := []string{"ca", certs.CA, "cert", certs.ClientCert, "key", certs.ClientKey}
	for _, c := range []struct {
		url  string
		ok   bool
		want string // in the error
	}{
		{"rediss://" + addr + "/0?" + q(client...), true, ""},
		{"rediss+quorum://" + addr + "/0?" + q(client...), true, ""},
		{"redis://" + addr + "/0?" + q(append(client, "server_name", "redis.example")...), true, ""},
		{"rediss://" + addr + "/0?" + q("ca", certs.CA), false, "certificate"},
		{"rediss://" + addr + "/0?" + q("ca", other.CA, "cert", certs.ClientCert, "key", certs.ClientKey), false, "certificate"},
		{"rediss://" + addr + "/0?" + q(append(client, "server_name", "elsewhere.example")...), false, "elsewhere.example"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		var d backend.Driver
		var err error
		if strings.Contains(c.url, "+quorum") {
			d, err = OpenQuorum(ctx, c.url)
		} else {
			d, err = Open(ctx, c.url)
		}
		took := time.Since(start)
		if c.ok {
			if err != nil {
				t.Errorf("%s: %v", c.url, err)
			} else {
				l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Second}
				if _, err := d.TryAcquire(ctx, l); err != nil {
					t.Errorf("%s: TryAcquire: %v", c.url, err)
				}
				d.Close()
			}
		} else {
			if err == nil {
				d.Close()
				t.Errorf("%s: Open succeeded", c.url)
			} else if !strings.Contains(err.Error(), c.want) || took > time.Second {
				t.Errorf("%s: after %v: %v, want an error that names %q, within a second", c.url, took, err, c.want)
			}
		}
		cancel()
	}
}
