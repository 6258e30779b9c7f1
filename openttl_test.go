package locker_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// seen records the default TTL each ttlprobe:// Open found in its context.
var seen struct {
	sync.Mutex
	ttl map[string]time.Duration // by the URL's host; absent when none
}

func init() {
	seen.ttl = map[string]time.Duration{}
	backend.Register("ttlprobe", backend.Opener{Usage: "ttlprobe://NAME (tests)", Open: func(ctx context.Context, u *url.URL) (backend.Driver, error) {
		if ttl, ok := backend.DefaultTTL(ctx); ok {
			seen.Lock()
			seen.ttl[u.Host] = ttl
			seen.Unlock()
		}
		return memlock.New(memlock.NewStore())
	}})
}

// TestOpenPassesDefaultTTL: the opener sees the default TTL that the URL or
// an option set, and none when neither did.
func TestOpenPassesDefaultTTL(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		url  string
		opts []locker.Option
		want time.Duration // 0: none
	}{
		{"none", "ttlprobe://none", nil, 0},
		{"url", "ttlprobe://url?ttl=2s", nil, 2 * time.Second},
		{"option", "ttlprobe://option", []locker.Option{locker.WithDefaultTTL(3 * time.Second)}, 3 * time.Second},
		{"url-wins", "ttlprobe://url-wins?ttl=4s", []locker.Option{locker.WithDefaultTTL(3 * time.Second)}, 4 * time.Second},
		{"default-value", "ttlprobe://default-value", []locker.Option{locker.WithDefaultTTL(locker.DefaultTTL)}, locker.DefaultTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := locker.Open(ctx, tc.url, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			seen.Lock()
			got := seen.ttl[tc.name]
			seen.Unlock()
			if got != tc.want {
				t.Errorf("the opener saw default TTL %v, want %v", got, tc.want)
			}
		})
	}
	// OpenDriver passes the URL's ttl too.
	drv, _, err := locker.OpenDriver(ctx, "ttlprobe://driver-only?ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	drv.Close()
	seen.Lock()
	defer seen.Unlock()
	if got := seen.ttl["driver-only"]; got != 5*time.Second {
		t.Errorf("OpenDriver: the opener saw default TTL %v, want 5s", got)
	}
}
