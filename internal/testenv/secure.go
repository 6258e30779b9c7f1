package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lockerhq/locker/internal/servers"
)

// SecureCerts are the certificates the secured instances use: the CA, the
// servers' certificate (127.0.0.1 and localhost), a client certificate with
// CN=locker and, in Admin, one with CN=root.
type SecureCerts struct {
	Certs
	AdminCert, AdminKey string
}

// Secure returns the secured instances' certificates, from
// LOCKER_SECURE_CERTS or the services directory's certs/. It fails the test,
// or skips it outside CI, when they are missing (see [Require]).
func Secure(t testing.TB) *SecureCerts {
	t.Helper()
	dir := os.Getenv(servers.EnvSecureCerts)
	if dir == "" {
		if d := os.Getenv("LOCKER_SERVICES_DIR"); d != "" {
			dir = filepath.Join(d, "certs")
		} else if p, err := ScriptPath(); err == nil {
			dir = filepath.Join(filepath.Dir(filepath.Dir(p)), ".services", "certs")
		}
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	c := &SecureCerts{
		Certs: Certs{
			CA:         f("ca.pem"),
			ServerCert: f("server.pem"), ServerKey: f("server-key.pem"),
			ClientCert: f("client.pem"), ClientKey: f("client-key.pem"),
		},
		AdminCert: f("admin.pem"), AdminKey: f("admin-key.pem"),
	}
	if _, err := os.Stat(c.AdminCert); err != nil {
		msg := "testenv: the secured instances' certificates are missing (" + err.Error() + "); start them with `scripts/services.sh up secure`"
		if requireServers() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return c
}
