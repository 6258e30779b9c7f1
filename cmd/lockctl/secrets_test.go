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
		if out := p.stderr.String(); strings.Contains(out, "Canary") {
			t.Errorf("stderr shows a secret: %s", out)
		}
	}
}
