package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// The store tries (measure.StoreTries) count the grant statements of
// waiting only: one for an Acquire of a free lock, none for TryAcquire;
// while a lock is held elsewhere, only the first of a process's waiters
// tries (its first tries and backoff timer), not every waiter; and each
// release hands the lock to the next waiter with a few tries, not one per
// waiter.
func TestStoreTries(t *testing.T) {
	t.Parallel()
	holderDriver, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	tries, _ := measure.StoreTries(d)
	claim := func(key string) backend.Claim {
		return backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute}
	}

	free := claim("ns/tries-free")
	if _, err := d.TryAcquire(ctx, free); err != nil {
		t.Fatal(err)
	}
	if n := tries(); n != 0 {
		t.Fatalf("StoreTries %d after a TryAcquire, want 0", n)
	}
	if err := d.Release(ctx, free); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, free); err != nil {
		t.Fatal(err)
	}
	if n := tries(); n != 1 {
		t.Fatalf("StoreTries %d after an Acquire of a free lock, want 1", n)
	}

	const waiters = 8
	key := "ns/tries"
	held := claim(key)
	g, err := holderDriver.TryAcquire(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	held.Fence = g.Fence
	done := make(chan error, waiters)
	for i := range waiters {
		go func() {
			c := claim(key)
			g, err := d.Acquire(ctx, c)
			if err == nil {
				c.Fence = g.Fence
				err = d.Release(ctx, c)
			}
			done <- err
		}()
		waitQueued(t, d, key, i+1)
	}
	// The first waiter's tries in 300 ms: its first, one once subscribed,
	// and its backoff timer's (at least 1, 2, 4 ... 125 ms apart): at
	// most 10; every waiter trying would be 16 or more.
	time.Sleep(300 * time.Millisecond)
	before := tries() - 1
	if before < 1 || before > 10 {
		t.Fatalf("%d tries by %d waiters while the lock was held elsewhere, want 1 to 10", before, waiters)
	}
	if err := holderDriver.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Each grant: the woken waiter's try, and perhaps its timer's racing
	// the notification. A herd (every waiter trying at each release)
	// would be 8+7+...+1 = 36.
	if after := tries() - 1 - before; after < waiters || after > 3*waiters {
		t.Fatalf("%d tries for %d hand-offs, want %d to %d", after, waiters, waiters, 3*waiters)
	}
}
