package backend

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS reads the TLS parameters of a backend URL, one vocabulary for every
// store that speaks TLS:
//
//	tls=true             use TLS (implied by the others, and by a TLS scheme: on)
//	ca=FILE              PEM file of the CA certificates to trust instead of the system's
//	cert=FILE, key=FILE  client certificate and key (PEM), for client authentication
//	server_name=NAME     the name the server's certificate must carry (default: the host dialled)
//	skip_verify=true     accept any server certificate: tests only; SkipVerify warns of it
//
// It returns nil, nil when the URL asks for no TLS and on is false. A file
// that cannot be read or holds no certificate is an ErrInvalidURL error
// before any network call. The server_name check is done by the returned
// config itself (VerifyConnection), so that it holds even where a client
// library sets ServerName from the address it dials (gRPC does).
func (p *Params) TLS(on bool) (*tls.Config, error) {
	on = p.Bool("tls", on)
	ca := p.String("ca", "")
	cert := p.String("cert", "")
	key := p.String("key", "")
	name := p.String("server_name", "")
	skip := p.Bool("skip_verify", false)
	if !on && ca == "" && cert == "" && key == "" && name == "" && !skip {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidURL, fmt.Sprintf(format, args...))
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, bad("ca: %v", errors.Unwrap(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad("ca: no PEM certificate in %s", ca)
		}
		tc.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, bad("cert and key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, bad("cert/key: %v", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	switch {
	case skip:
		tc.InsecureSkipVerify = true
	case name != "":
		// Verify the chain and the name here, whatever ServerName the
		// library sets from the address it dials.
		roots := tc.RootCAs
		tc.InsecureSkipVerify = true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return tc, nil
}

// SkipVerify reports whether c accepts any server certificate because the
// URL said skip_verify=true, for the driver's warning.
func SkipVerify(c *tls.Config) bool {
	return c != nil && c.InsecureSkipVerify && c.VerifyConnection == nil
}
