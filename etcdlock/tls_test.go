package etcdlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// tlsFront is a TLS front for an etcd member, as its TLS client URL would
// be: it presents certs' server certificate (speaking h2, as gRPC wants),
// requires a client certificate from certs' CA, and passes the plain bytes
// on to target.
func tlsFront(t *testing.T, certs *testenv.Certs, target string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		NextProtos: []string{"h2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer wg.Done(); io.Copy(c, s); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// TLS from the URL: the CA and client certificate come from ca=, cert= and
// key=, and server_name= is checked although gRPC dials an address the
// certificate does not name; a wrong CA or name fails Open.
func TestTLSFromURL(t *testing.T) {
	endpoints := testenv.EtcdEndpoints()
	testenv.Require(t, endpoints...)
	t.Parallel()
	// The server certificate names etcd.example only, not 127.0.0.1.
	certs := testenv.NewCertsFor(t, "etcd.example")
	other := testenv.NewCertsFor(t, "etcd.example")
	front := tlsFront(t, certs, endpoints[0])
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
		{q(client...), "127.0.0.1"}, // the address is not in the certificate
		{q(append(client, "server_name", "elsewhere.example")...), "elsewhere.example"},
		{q("ca", other.CA, "cert", certs.ClientCert, "key", certs.ClientKey, "server_name", "etcd.example"), "certificate"},
	} {
		u, err := url.Parse("etcd://" + front + "/locker-test-tls?" + c.query)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := Open(ctx, u)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.query, err)
		case c.want == "":
			l := backend.Lock{Key: "tls-" + t.Name(), Token: "tok-" + t.Name(), TTL: 2 * time.Second}
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
			t.Logf("%s: %v (want it to say %q)", c.query, err, c.want)
		}
		cancel()
	}
}
