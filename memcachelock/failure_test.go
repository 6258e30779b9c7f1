package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// acquireWithin retries TryAcquire, through any error, until d passes.
func acquireWithin(t *testing.T, ctx context.Context, c *locker.Client, name string, d time.Duration) *locker.Lock {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l, err := c.TryAcquire(ctx, name)
		if err == nil {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryAcquire(%q) did not succeed within %v: %v", name, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A restart of memcached loses every lock: the holder learns it at its next
// refresh, and fences drawn after the restart are still larger.
func TestRestart(t *testing.T) {
	addr := testenv.MemcacheRestartAddr() // no other package uses it
	testenv.Require(t, addr)
	ctx := testCtx(t, 2*time.Minute)
	const ttl = 6 * time.Second // refreshed every 2s
	ns := "mctest-" + randHex(4)
	c1 := openClient(t, addr, locker.WithNamespace(ns), locker.WithDefaultTTL(ttl))
	c2 := openClient(t, addr, locker.WithNamespace(ns), locker.WithDefaultTTL(ttl))
	for range 3 {
		l, err := c2.TryAcquire(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		l.Release(ctx)
	}
	held, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	before := held.Fence()

	stopped := time.Now()
	testenv.Stop(t, "memcached-restart")
	testenv.Start(t, "memcached-restart")
	restarted := time.Now()
	t.Logf("memcached restarted in %v", restarted.Sub(stopped))

	select {
	case <-held.Lost():
		t.Logf("lost %v after the restart: %v", time.Since(restarted), held.Err())
		if !errors.Is(held.Err(), locker.ErrLost) {
			t.Fatalf("Err() = %v, want ErrLost", held.Err())
		}
	case <-time.After(ttl/3 + 3*time.Second):
		t.Fatalf("Lost did not fire within %v after the restart", ttl/3+3*time.Second)
	}
	if restarted.Sub(stopped) < ttl*2/3 && !strings.Contains(held.Err().Error(), "refresh found it gone") {
		t.Errorf("the loss should be found by a refresh: %v", held.Err())
	}
	if err := held.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release of the lost lock = %v, want ErrNotHeld", err)
	}
	// The restarted server refuses the name until it has run for the TTL:
	// a holder it forgot may run until then (restart.go). The first call
	// on each pooled connection meets a closed connection and is repeated
	// on a new one, so the refusal is not an error.
	if _, err := c2.TryAcquire(ctx, "x"); !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "started less than a TTL ago") {
		t.Fatalf("TryAcquire right after the restart = %v, want ErrNotAcquired saying why", err)
	}
	after := acquireWithin(t, ctx, c2, "x", ttl+5*time.Second)
	if since := time.Since(stopped); since < ttl {
		t.Fatalf("the restarted server granted the name %v after it stopped, less than the TTL %v", since, ttl)
	}
	t.Logf("granted again %v after the restart", time.Since(restarted))
	if after.Fence() <= before {
		t.Fatalf("fence %d after the restart, %d before: must increase", after.Fence(), before)
	}
	t.Logf("fence before the restart %d, after %d", before, after.Fence())
	after.Release(ctx)
}

// With too little memory, memcached evicts a held lock; the holder's next
// refresh finds the loss rather than ignoring it, and the next holder's
// fence is still larger (its counter was likely evicted too).
func TestEviction(t *testing.T) {
	addr := testenv.MemcacheSmallAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, 2*time.Minute)
	const ttl = 3 * time.Second // refreshed every second
	ns := "mctest-" + randHex(4)
	c1 := openClient(t, addr, locker.WithNamespace(ns), locker.WithDefaultTTL(ttl))
	c2 := openClient(t, addr, locker.WithNamespace(ns), locker.WithDefaultTTL(ttl))
	held, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	lk := lockKey(backend.Key(ns, "x"))

	// Flood with items of the lock's size (key and value), so that they
	// share its slab class, from several connections, until it is lost.
	flood := memcache.New(addr)
	flood.MaxIdleConns = 8
	defer flood.Close()
	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	it, err := flood.Get(lk)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte(strings.Repeat("v", len(it.Value)))
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("fl%d-%d-%s", w, i, ns)
				if len(k) < len(lk) {
					k += strings.Repeat("p", len(lk)-len(k))
				}
				flood.Set(&memcache.Item{Key: k, Value: value, Expiration: 60})
				sent.Add(1)
			}
		})
	}
	start := time.Now()
	select {
	case <-held.Lost():
	case <-time.After(60 * time.Second):
	}
	close(stop)
	wg.Wait()
	select {
	case <-held.Lost():
	default:
		t.Fatalf("after %d items in %v the lock was not found lost", sent.Load(), time.Since(start))
	}
	t.Logf("lost after %v and %d flood items: %v", time.Since(start), sent.Load(), held.Err())
	if !errors.Is(held.Err(), locker.ErrLost) || !strings.Contains(held.Err().Error(), "refresh found it gone") {
		t.Fatalf("Err() = %v, want ErrLost found by a refresh", held.Err())
	}
	if err := held.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release of the evicted lock = %v, want ErrNotHeld", err)
	}
	next := acquireWithin(t, ctx, c2, "x", 10*time.Second)
	if next.Fence() <= held.Fence() {
		t.Fatalf("fence %d after the eviction, %d before: must increase", next.Fence(), held.Fence())
	}
	next.Release(ctx)
}
