package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs are PEM files of a throw-away CA and of a server and a client
// certificate it signed, in a test's temporary directory.
type Certs struct {
	CA                    string // the CA certificate
	ServerCert, ServerKey string // for 127.0.0.1 and the names given to NewCerts
	ClientCert, ClientKey string // client authentication, common name "locker-test"
}

// NewCerts makes a CA and its server and client certificates. The server
// certificate is valid for 127.0.0.1 and for names.
func NewCerts(t testing.TB, names ...string) *Certs {
	t.Helper()
	return newCerts(t, true, names)
}

// NewCertsFor is NewCerts with a server certificate valid for names only,
// not for 127.0.0.1: a client must check it against a name it is given.
func NewCertsFor(t testing.TB, names ...string) *Certs {
	t.Helper()
	return newCerts(t, false, names)
}

func newCerts(t testing.TB, loopbackIP bool, names []string) *Certs {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newKey(t), &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "locker test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caCert, caCert, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	c := &Certs{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, c.CA, "CERTIFICATE", caDER)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string, name string) (string, string) {
		key := newKey(t)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cp, kp := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, cp, "CERTIFICATE", der)
		writePEM(t, kp, "PRIVATE KEY", kd)
		return cp, kp
	}
	var ips []net.IP
	if loopbackIP {
		ips = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	c.ServerCert, c.ServerKey = leaf(2, "locker test server", x509.ExtKeyUsageServerAuth, ips, names, "server")
	c.ClientCert, c.ClientKey = leaf(3, "locker-test", x509.ExtKeyUsageClientAuth, nil, nil, "client")
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
