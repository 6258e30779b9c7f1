package locker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// counting counts a driver's TryAcquire calls.
type counting struct {
	backend.Driver
	tries atomic.Int64
}

func (c *counting) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	c.tries.Add(1)
	return c.Driver.TryAcquire(ctx, l)
}

// notifying is counting with its driver's release notifications.
type notifying struct {
	*counting
	backend.Notifier
}

// A Client's waiters on an object are served in arrival order, only the
// first of them tries the store, one that gives up leaves its place to
// the next, and a releaser that comes back waits behind those already
// waiting; with and without the store's release notifications.
func TestTurnstile(t *testing.T) {
	for _, notify := range []bool{true, false} {
		name := map[bool]string{true: "notified", false: "polled"}[notify]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := memlock.NewStore()
			md, err := memlock.New(store)
			if err != nil {
				t.Fatal(err)
			}
			cd := &counting{Driver: md}
			var drv backend.Driver = cd
			if notify {
				drv = notifying{cd, md}
			}
			c, err := New(drv)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			od, _ := memlock.New(store)
			other, err := New(od)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			testTurnstile(t, c, other, cd)
		})
	}
}

func testTurnstile(t *testing.T, c, other *Client, cd *counting) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obj := objectOf(backend.Key(c.cfg.namespace, "x"), backend.Exclusive)
	type result struct {
		i   int
		l   *Lock
		err error
	}
	got := make(chan result, 4)
	queued := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		if ts := c.turns[obj]; ts != nil {
			return len(ts.waiters)
		}
		return 0
	}
	waitQueued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for queued() != n {
			if time.Now().After(deadline) {
				select {
				case r := <-got:
					t.Logf("result: waiter %d %v", r.i, r.err)
				default:
				}
				t.Fatalf("%d waiters queued, want %d", queued(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	start := func(ctx context.Context, i int) {
		n := queued() + 1
		go func() {
			l, err := c.Acquire(ctx, "x")
			got <- result{i, l, err}
		}()
		waitQueued(n)
	}
	holder, err := other.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancelSecond := context.WithCancel(ctx)
	for i := range 3 {
		if i == 1 {
			start(wctx, i)
		} else {
			start(ctx, i)
		}
	}
	cancelSecond()
	if r := <-got; r.i != 1 || !errors.Is(r.err, ErrNotAcquired) {
		t.Fatalf("cancelled waiter: waiter %d, %v; want waiter 1, ErrNotAcquired", r.i, r.err)
	}
	waitQueued(2)
	// The first waiter's tries in 300ms while the lock is held elsewhere:
	// its first, perhaps one once subscribed, then its backoff timer's
	// (at least 1, 2, 4 ... 125ms apart): at most 10. Every waiter trying
	// would be 2 waiters' worth or more.
	before := cd.tries.Load()
	time.Sleep(300 * time.Millisecond)
	if n := cd.tries.Load() - before; n > 10 {
		t.Fatalf("%d tries in 300ms by 2 waiters while the lock was held elsewhere, want at most 10", n)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first.i != 0 || first.err != nil {
		t.Fatalf("first served: waiter %d, %v; want waiter 0", first.i, first.err)
	}
	// The releaser comes back, behind waiter 2.
	start(ctx, 3)
	before = cd.tries.Load()
	if err := first.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second.i != 2 || second.err != nil {
		t.Fatalf("second served: waiter %d, %v; want waiter 2", second.i, second.err)
	}
	if err := second.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	third := <-got
	if third.i != 3 || third.err != nil {
		t.Fatalf("third served: waiter %d, %v; want waiter 3", third.i, third.err)
	}
	// Two hand-offs here: each the woken waiter's try, perhaps a timer's
	// racing the wake-up. A herd would try at each release once per waiter.
	if n := cd.tries.Load() - before; n > 6 {
		t.Fatalf("%d tries for 2 hand-offs, want at most 6", n)
	}
	if err := third.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d waiters left queued, want 0", n)
	}
}
