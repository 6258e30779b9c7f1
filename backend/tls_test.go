package backend_test

import (
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// tlsParams reads the TLS parameters of a URL with the given query.
func tlsParams(t *testing.T, query string) (*tls.Config, error) {
	t.Helper()
	u, err := url.Parse("x://h?" + query)
	if err != nil {
		t.Fatal(err)
	}
	p := backend.NewParams(u)
	c, err := p.TLS(false)
	if err == nil {
		err = p.Err()
	}
	return c, err
}

// handshake dials a TLS server that presents certs' server certificate,
// as a client library that sets ServerName to the address it dials would,
// and reports the client's handshake error.
func handshake(t *testing.T, certs *testenv.Certs, c *tls.Config) error {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c = c.Clone()
	c.ServerName = "127.0.0.1" // what a library sets from the address it dials
	return tls.Client(raw, c).Handshake()
}

func TestTLSParams(t *testing.T) {
	certs := testenv.NewCerts(t, "store.example")
	other := testenv.NewCerts(t, "store.example")
	if c, err := tlsParams(t, ""); c != nil || err != nil {
		t.Fatalf("no TLS parameter: %v, %v", c, err)
	}
	cases := []struct {
		query string
		ok    bool
	}{
		{"ca=" + certs.CA, true},                                // the address is in the certificate
		{"ca=" + certs.CA + "&server_name=store.example", true}, // the name is, whatever the library sets
		{"ca=" + certs.CA + "&server_name=elsewhere.example", false},
		{"ca=" + other.CA + "&server_name=store.example", false}, // another CA
		{"ca=" + other.CA, false},
		{"tls=true", false}, // the system's roots do not know the test CA
		{"tls=true&skip_verify=true", true},
		{"ca=" + certs.CA + "&cert=" + certs.ClientCert + "&key=" + certs.ClientKey, true},
	}
	for _, c := range cases {
		tc, err := tlsParams(t, c.query)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		err = handshake(t, certs, tc)
		if (err == nil) != c.ok {
			t.Errorf("%s: handshake error %v, want success %v", c.query, err, c.ok)
		}
	}
	for _, bad := range []string{"ca=/nonexistent.pem", "ca=" + certs.ClientKey, "cert=" + certs.ClientCert, "cert=" + certs.ClientCert + "&key=" + certs.ServerKey, "skip_verify=maybe"} {
		_, err := tlsParams(t, bad)
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s: %v, want ErrInvalidURL", bad, err)
		}
	}
	tc, _ := tlsParams(t, "tls=true&skip_verify=true")
	if !backend.SkipVerify(tc) {
		t.Error("SkipVerify is false for skip_verify=true")
	}
	tc, _ = tlsParams(t, "server_name=store.example")
	if backend.SkipVerify(tc) {
		t.Error("SkipVerify is true for a config that verifies the name itself")
	}
}
