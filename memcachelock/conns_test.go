package memcachelock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestConnectionsBounded: many goroutines taking locks at once on one
// driver share its connections instead of dialing one per request (which
// cost the names workload half its CPU, and passed memcached's connection
// limit). The requests in flight are bounded, and Open keeps that many
// idle, so a driver dials about inFlight connections, plus the fence's
// probe connections (restart.go, at most max_idle), whatever the load.
// (Without the bound: 1,445 dials here.)
func TestConnectionsBounded(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	d := openDriver(t, testenv.MemcacheAddr())
	var dials atomic.Int64
	var nd net.Dialer
	d.mc.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return nd.DialContext(ctx, network, addr)
	}
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	const goroutines, rounds = 200, 5
	cycle := func(key string) error {
		c := backend.Claim{Key: key, Token: randHex(16), TTL: 5 * time.Second, Mode: backend.Exclusive}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			return err
		}
		c.Fence = g.Fence
		return d.Release(ctx, c)
	}
	// A name's first acquisition seeds its fence counter on a probe
	// connection of its own (restart.go): seeded one by one first.
	for g := range goroutines {
		if err := cycle(ns + "-" + strconv.Itoa(g)); err != nil {
			t.Fatal(err)
		}
	}
	dials.Store(0)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for range rounds {
				if err := cycle(ns + "-" + strconv.Itoa(g)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d dials", dials.Load())
	if n, most := dials.Load(), int64(2*inFlight+4); n > most {
		t.Fatalf("%d goroutines dialed %d connections, want at most %d", goroutines, n, most)
	}
}

// TestPermitRoundTrips: an uncontended permit on a semaphore used before
// costs the slot's add, the fence's incr with the limit record's gets (one
// write), the record's cas, and to release, the slot's gets and cas: five
// round trips (seven before the record was read with the draw and the
// release used the cas id its gets found).
func TestPermitRoundTrips(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, writes, _ := countedDriver(t)
	key := uniqueKey(t, "sem")
	cycle := func() {
		t.Helper()
		c := backend.Claim{Key: key, Token: token(), TTL: time.Second, Mode: backend.Permit, Limit: 3}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // seeds the counter, writes the record, dials
	for i := range 3 {
		w0 := writes.Load()
		cycle()
		if n := writes.Load() - w0; n != 5 {
			t.Errorf("cycle %d: %d round trips, want 5", i, n)
		}
	}
}

// TestCallWaitsAtMostTimeout: a request that finds every turn taken (as
// requests hanging on a dead server would keep them) goes anyway after the
// client's timeout, instead of waiting behind them one after another.
func TestCallWaitsAtMostTimeout(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	d, err := Open(testCtx(t, 10*time.Second), "memcache://"+testenv.MemcacheAddr(), WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	for range cap(d.slots) {
		d.slots <- struct{}{}
	}
	t.Cleanup(func() {
		for range cap(d.slots) {
			<-d.slots
		}
	})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := d.get(context.Background(), "mctest-"+randHex(4)+"-absent")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("get: %v, want a cache miss", err)
		}
		if took := time.Since(start); took < 90*time.Millisecond {
			t.Fatalf("the get went after %v, before the timeout with every turn taken", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request waited more than 10s for a turn")
	}
}
