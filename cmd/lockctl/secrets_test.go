package main

import (
	"strings"
	"testing"
)

// No password or secret parameter of a backend URL reaches lockctl's
// stderr, whatever the backend and however the URL is wrong.
func TestStderrKeepsSecrets(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"redis://127.0.0.1:1/0?password=CanaryA",
		"redis://127.0.0.1:1/0?sslpassword=CanaryB",
		"redis://u:CanaryC@127.0.0.1:1/0?dial_timeout=bogus",
		"redis://u:CanaryC@127.0.0.1:1/0?dial_timeout=200ms",
		"rediss+cluster://u:CanaryD@127.0.0.1:1?token=CanaryE",
		"redis+quorum://u:CanaryF@127.0.0.1:1,127.0.0.1:2/0?secret=CanaryG",
		"etcd://u:CanaryH@127.0.0.1:1?password=CanaryI",
		"etcd://127.0.0.1:1?token=CanaryJ",
		"zk://u:CanaryK@127.0.0.1:1/x?password=CanaryL",
		"postgres://u:CanaryM@127.0.0.1:1/db?password=CanaryN&bogus=1",
		"postgres://u@127.0.0.1:1/db?password=CanaryN&connect_timeout=1",
		"postgres://u@127.0.0.1:1/db?sslpassword=CanaryO&sslmode=disable&connect_timeout=1",
		"memcache://127.0.0.1:1?password=CanaryP",
		"file:///tmp/x?password=CanaryQ",
		"nosuch://u:CanaryR@h?password=CanaryS",
	} {
		p := lockctlProc("run", "--connect-timeout", "2s", "--backend", u, "x", "--", "true")
		code, _ := p.status(t)
		if code == 0 {
			t.Errorf("%s: exit 0", u)
		}
		out := p.stderr.String()
		if strings.Contains(out, "Canary") {
			t.Errorf("stderr shows a secret: %s", out)
		}
		// Errors say each thing once: the URL too.
		if scheme, _, _ := strings.Cut(u, "://"); strings.Count(out, scheme+"://") > 1 {
			t.Errorf("stderr names the URL more than once: %s", out)
		}
	}
}

// Weak transport is reported on lockctl's stderr (the Client's logger,
// which drivers opened by URL now share), without the password.
func TestWeakTransportWarnings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"redis://:CanaryW@192.0.2.1:6379/0?dial_timeout=200ms", "in clear"},
		{"rediss://:CanaryW@192.0.2.1:6379/0?dial_timeout=200ms&skip_verify=true", "skip_verify"},
		{"etcd://u:CanaryW@192.0.2.1:2379?dial_timeout=200ms", "in clear"},
		{"postgres://u:CanaryW@192.0.2.1:5432/db?connect_timeout=1", "sslmode=prefer"},
		{"postgres://u@192.0.2.1:5432/db?sslmode=disable&connect_timeout=1", "sslmode=disable"},
	} {
		p := lockctlProc("run", "--connect-timeout", "1s", "--backend", c.url, "x", "--", "true")
		p.status(t)
		out := p.stderr.String()
		if !strings.Contains(out, c.want) || strings.Contains(out, "CanaryW") {
			t.Errorf("%s: stderr %q, want a warning that says %q, without the password", c.url, out, c.want)
		}
	}
}
