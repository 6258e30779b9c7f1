package zklock

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func sharedClaim(t testing.TB, key string, mode backend.Mode, limit int) backend.Claim {
	return backend.Claim{Key: key, Token: newToken(t), TTL: time.Second, Mode: mode, Limit: limit}
}

// sharedEntries counts the nodes of key's semaphore or read-write lock.
func sharedEntries(t testing.TB, d *Driver, l backend.Claim) int {
	t.Helper()
	parent := d.queueParent(l)
	if _, err := d.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
	names, _, err := d.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

// A semaphore's queue: the first limit nodes hold, the others wait in
// order; another limit fails and leaves nothing; a lock of the same name
// is another object.
func TestSemaphoreQueue(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d1, d2 := dial(t, servers), dial(t, servers)
	ctx := context.Background()
	key := uniqueKey(t)

	var held []backend.Claim
	var last uint64
	for i, d := range []*Driver{d1, d2} {
		c := sharedClaim(t, key, backend.Permit, 2)
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		if g.Fence <= last {
			t.Errorf("fence %d after %d", g.Fence, last)
		}
		last = g.Fence
		c.Fence = g.Fence
		held = append(held, c)
	}
	if _, err := d1.TryAcquire(ctx, sharedClaim(t, key, backend.Permit, 2)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v", err)
	}
	if _, err := d2.TryAcquire(ctx, sharedClaim(t, key, backend.Permit, 3)); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("limit 3 against 2: %v", err)
	}
	ctx3, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := acquire(ctx3, d2, sharedClaim(t, key, backend.Permit, 3)); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("waiting with limit 3 against 2: %v", err)
	}
	if n := sharedEntries(t, d1, held[0]); n != 2 {
		t.Errorf("%d nodes after the refusals, want 2", n)
	}
	// The lock of the same name is free.
	lk := lockFor(t, key)
	if _, err := d1.TryAcquire(ctx, lk); err != nil {
		t.Fatalf("the lock of the name: %v", err)
	}
	if err := d1.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}

	// Two waiters, served in arrival order as permits free.
	type result struct {
		i int
		g backend.Grant
	}
	got := make(chan result, 2)
	w := []backend.Claim{sharedClaim(t, key, backend.Permit, 2), sharedClaim(t, key, backend.Permit, 2)}
	for i := range w {
		go func() {
			g, err := acquire(ctx3, d1, w[i])
			if err != nil {
				t.Error(err)
			}
			got <- result{i, g}
		}()
		// Queued before the next one starts.
		deadline := time.Now().Add(5 * time.Second)
		for sharedEntries(t, d2, held[0]) != 3+i {
			if time.Now().After(deadline) {
				t.Fatal("waiter not queued")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Released by another driver than the one that holds it.
	if err := d2.Release(ctx, held[0]); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.i != 0 || r.g.Fence <= last {
		t.Errorf("first served: waiter %d fence %d (last %d)", r.i, r.g.Fence, last)
	}
	select {
	case r := <-got:
		t.Fatalf("waiter %d served with one permit free", r.i)
	case <-time.After(100 * time.Millisecond):
	}
	if err := d2.Release(ctx, held[1]); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.i != 1 {
		t.Errorf("second served: waiter %d", r.i)
	}
	for _, c := range w {
		if err := d1.Release(ctx, c); err != nil {
			t.Error(err)
		}
	}
	if n := sharedEntries(t, d1, held[0]); n != 0 {
		t.Errorf("%d nodes left", n)
	}
	// None held: the next limit holds.
	c := sharedClaim(t, key, backend.Permit, 1)
	if _, err := d2.TryAcquire(ctx, c); err != nil {
		t.Fatalf("limit 1 once free: %v", err)
	}
	if err := d2.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// Readers share; a waiting writer keeps later readers out, is served when
// the readers leave, and a writer that gives up leaves nothing.
func TestRWQueue(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d1, d2 := dial(t, servers), dial(t, servers)
	ctx := context.Background()
	key := uniqueKey(t)

	r1, r2 := sharedClaim(t, key, backend.Read, 0), sharedClaim(t, key, backend.Read, 0)
	for _, c := range []backend.Claim{r1, r2} {
		if _, err := d1.TryAcquire(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d2.TryAcquire(ctx, sharedClaim(t, key, backend.Write, 0)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("writer with readers: %v", err)
	}
	// A writer that stops waiting leaves nothing.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := acquire(short, d2, sharedClaim(t, key, backend.Write, 0))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled writer: %v", err)
	}
	if n := sharedEntries(t, d1, r1); n != 2 {
		t.Errorf("%d nodes after a cancelled writer, want 2", n)
	}

	wr := sharedClaim(t, key, backend.Write, 0)
	done := make(chan backend.Grant, 1)
	go func() {
		g, err := acquire(ctx, d2, wr)
		if err != nil {
			t.Error(err)
		}
		done <- g
	}()
	deadline := time.Now().Add(5 * time.Second)
	for sharedEntries(t, d1, r1) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("writer not queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := d1.TryAcquire(ctx, sharedClaim(t, key, backend.Read, 0)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader behind a waiting writer: %v", err)
	}
	for _, c := range []backend.Claim{r1, r2} {
		if err := d1.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	var g backend.Grant
	select {
	case g = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writer not served")
	}
	wr.Fence = g.Fence
	if err := d2.Refresh(ctx, wr); err != nil {
		t.Fatal(err)
	}
	// A forged token touches nothing.
	if err := d1.Release(ctx, sharedClaim(t, key, backend.Write, 0)); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("forged release: %v", err)
	}
	if err := d1.Release(ctx, wr); err != nil {
		t.Fatal(err)
	}
	if n := sharedEntries(t, d1, r1); n != 0 {
		t.Errorf("%d nodes left", n)
	}
}

// A holder whose session the server expires frees its permit: the waiter
// behind it is served.
func TestSemaphoreSessionExpiry(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d1, d2, watcher := dial(t, servers), dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	c1 := sharedClaim(t, key, backend.Permit, 1)
	if _, err := d1.TryAcquire(ctx, c1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, d2, sharedClaim(t, key, backend.Permit, 1))
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for sharedEntries(t, watcher, c1) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("waiter not queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := expireKey(ctx, servers, watcher, key); err != nil {
		t.Fatal(err)
	}
	// The holder's node is gone: the waiter hears of it at once.
	start := time.Now()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > testTimeout {
		t.Errorf("served %v after the holder's node went", el)
	}
}

// Through the Client: never more than the limit inside, 8 goroutines of
// two clients.
func TestSemaphoreClient(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	key := uniqueKey(t)
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for i := range 2 {
		c, err := locker.New(dial(t, servers))
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			wg.Go(func() {
				for range 5 {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					l, err := c.Acquire(ctx, key, locker.Semaphore(3))
					cancel()
					if err != nil {
						t.Error(i, err)
						return
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(2 * time.Millisecond)
					inside.Add(-1)
					if err := l.Release(context.Background()); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if m := most.Load(); m > 3 {
		t.Errorf("%d inside at once, limit 3", m)
	}
}

// A permit costs what a lock does: the same node made and deleted.
// Interleaved on one driver, names known (their nodes exist).
//
//	go test -run '^$' -bench SemaphoreVsLock ./zklock
func BenchmarkSemaphoreVsLock(b *testing.B) {
	d := dial(b, testenv.ZKAddrs())
	ctx := context.Background()
	key := uniqueKey(b)
	var lockDs, semDs []time.Duration
	cycle := func(c backend.Claim) time.Duration {
		start := time.Now()
		if _, err := d.TryAcquire(ctx, c); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, c); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for b.Loop() {
		lockDs = append(lockDs, cycle(lockFor(b, key)))
		semDs = append(semDs, cycle(sharedClaim(b, key, backend.Permit, 4)))
	}
	l, s := median(lockDs), median(semDs)
	b.ReportMetric(float64(l.Microseconds()), "lock-µs")
	b.ReportMetric(float64(s.Microseconds()), "permit-µs")
	b.ReportMetric(float64(s)/float64(l), "permit/lock")
}

// Quick acquire and release cycles of every kind leave no watch on the
// server: the watch on a held node is not set on one released meanwhile
// (it would never fire, as a sequence number is never reused).
func TestNoWatchLeftAfterRelease(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d := dial(t, servers)
	ctx := context.Background()
	key := uniqueKey(t)
	for range 20 {
		for _, c := range []backend.Claim{lockFor(t, key), sharedClaim(t, key, backend.Permit, 3), sharedClaim(t, key, backend.Write, 0)} {
			if _, err := d.TryAcquire(ctx, c); err != nil {
				t.Fatal(err)
			}
			if err := d.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	esc := backend.EscapeKey(key)
	n := -1
	for deadline := time.Now().Add(3 * time.Second); n != 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out := fourLetter(t, servers[0], "wchc")
		if !strings.HasPrefix(out, "0x") && out != "" {
			t.Skipf("the server does not answer wchc: %q", out)
		}
		n = strings.Count(out, esc)
	}
	if n != 0 {
		t.Errorf("%d watches left on the name's nodes", n)
	}
}

func fourLetter(t testing.TB, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
