package memcachelock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func evictionLevel(t *testing.T, addr string) backend.Level {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := Open(ctx, "memcache://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err := d.Diagnose(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.StoreTime(ctx); err != nil || time.Since(st).Abs() > 5*time.Second {
		t.Errorf("StoreTime: %v, %v", st, err)
	}
	for _, f := range fs {
		if f.Check == "memcache.eviction" {
			if !strings.Contains(f.What, addr) {
				t.Errorf("%q does not name the server", f.What)
			}
			return f.Level
		}
	}
	t.Fatalf("no eviction finding in %+v", fs)
	return 0
}

// A server that refuses rather than evicts is sound; one that may evict
// but has not is a warning; one that has evicted is unsafe.
func TestDiagnose(t *testing.T) {
	if l := evictionLevel(t, testenv.StartMemcachedWith(t, "-M").Addr); l != backend.Sound {
		t.Errorf("memcached -M: %v, want ok", l)
	}
	small := testenv.StartMemcachedWith(t, "-m", "2")
	if l := evictionLevel(t, small.Addr); l != backend.Warning {
		t.Errorf("a fresh memcached that evicts: %v, want warning", l)
	}
	mc := memcache.New(small.Addr)
	defer mc.Close()
	v := make([]byte, 4096)
	for i := range 2000 { // 8 MB into 2
		if err := mc.Set(&memcache.Item{Key: "fill-" + strconv.Itoa(i), Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	if l := evictionLevel(t, small.Addr); l != backend.Unsafe {
		t.Errorf("a memcached that has evicted: %v, want unsafe", l)
	}
}
