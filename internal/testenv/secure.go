package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// The secured instances started by scripts/services.sh (group "secure"): TLS
// with a throw-away CA the script makes, and authentication. Their
// administrator authenticates with AdminPassword (or, for etcd, the admin
// certificate, CN=root).
const (
	EnvRedisTLSAddr    = "LOCKER_REDIS_TLS_ADDR"
	EnvPostgresTLSAddr = "LOCKER_POSTGRES_TLS_ADDR"
	EnvEtcdTLSEndpoint = "LOCKER_ETCD_TLS_ENDPOINT"
	EnvZKTLSAddr       = "LOCKER_ZK_TLS_ADDR"
	EnvSecureCerts     = "LOCKER_SECURE_CERTS"
	EnvAdminPassword   = "LOCKER_SECURE_ADMIN_PASSWORD"

	DefaultRedisTLSAddr    = "127.0.0.1:6390"
	DefaultPostgresTLSAddr = "127.0.0.1:5433"
	DefaultEtcdTLSEndpoint = "127.0.0.1:2390"
	DefaultZKTLSAddr       = "127.0.0.1:2190"
	DefaultAdminPassword   = "locker-admin-secret"
)

// RedisTLSAddr is the TLS port of the secured Redis (instance "redis-tls").
func RedisTLSAddr() string { return env(EnvRedisTLSAddr, DefaultRedisTLSAddr) }

// PostgresTLSAddr is the secured PostgreSQL (instance "postgres-tls").
func PostgresTLSAddr() string { return env(EnvPostgresTLSAddr, DefaultPostgresTLSAddr) }

// EtcdTLSEndpoint is the secured etcd's client endpoint (instance "etcd-tls").
func EtcdTLSEndpoint() string { return env(EnvEtcdTLSEndpoint, DefaultEtcdTLSEndpoint) }

// ZKTLSAddr is the TLS client port of the secured ZooKeeper (instance "zk-tls").
func ZKTLSAddr() string { return env(EnvZKTLSAddr, DefaultZKTLSAddr) }

// AdminPassword is the secured instances' administrator password.
func AdminPassword() string { return env(EnvAdminPassword, DefaultAdminPassword) }

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
	dir := os.Getenv(EnvSecureCerts)
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
