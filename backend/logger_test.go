package backend_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/lockerhq/locker/backend"
)

func TestWarnTransport(t *testing.T) {
	const canary = "Canary-pw"
	for _, c := range []struct {
		url  string
		tls  *tls.Config
		want string // in the log; "" for none
	}{
		{"redis://:" + canary + "@cache.example:6379/0", nil, "in clear"},
		{"redis://:" + canary + "@127.0.0.1:6379/0", nil, ""},
		{"redis://:" + canary + "@localhost:6379/0", nil, ""},
		{"redis://:" + canary + "@[::1]:6379/0", nil, ""},
		{"etcd://h1:2379,127.0.0.1:2379?password=" + canary, nil, "in clear"},
		{"redis://cache.example:6379/0", nil, ""},
		{"rediss://:" + canary + "@cache.example:6379/0", &tls.Config{}, ""},
		{"rediss://:" + canary + "@cache.example:6379/0", &tls.Config{InsecureSkipVerify: true}, "skip_verify"},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		ctx := backend.WithLogger(context.Background(), slog.New(slog.NewTextHandler(&buf, nil)))
		backend.WarnTransport(backend.Logger(ctx), u, c.tls)
		out := buf.String()
		if strings.Contains(out, canary) {
			t.Errorf("%s: the warning shows the password: %s", c.url, out)
		}
		if (c.want == "") != (out == "") || !strings.Contains(out, c.want) {
			t.Errorf("%s: logged %q, want %q", c.url, out, c.want)
		}
	}
	if backend.Logger(context.Background()) == nil {
		t.Error("Logger without WithLogger is nil")
	}
}

func TestRemote(t *testing.T) {
	got := backend.Remote([]string{"127.0.0.1:2379", "LOCALHOST:2181", "[::1]:2379", "http://localhost:2379", "https://[::1]:2379",
		"10.0.0.5:2379", "zk-1.example:2181", "https://etcd-1:2379", "unix:///tmp/etcd.sock"})
	want := []string{"10.0.0.5:2379", "zk-1.example:2181", "https://etcd-1:2379", "unix:///tmp/etcd.sock"}
	if !slices.Equal(got, want) {
		t.Errorf("Remote = %q, want %q", got, want)
	}
}
