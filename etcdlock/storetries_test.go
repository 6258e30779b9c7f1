package etcdlock

import (
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestStoreTries: a blocking acquisition of a free lock sends one request
// that could grant it (the transaction that puts its entry, alone under its
// directory); a waiter sends its first transaction and, once the holder
// releases, one look at its place. A try is not a waiting acquisition.
func TestStoreTries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, d1 := h.client(t)
	c2, d2 := h.client(t)
	tries1, _ := measure.StoreTries(d1)
	tries2, _ := measure.StoreTries(d2)

	l, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if n := tries1(); n != 0 {
		t.Fatalf("StoreTries after a TryAcquire = %d, want 0", n)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = c1.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if n := tries1(); n != 1 {
		t.Fatalf("StoreTries after an uncontended Acquire = %d, want 1", n)
	}

	got := make(chan error, 1)
	go func() {
		w, err := c2.Acquire(ctx, "x")
		if err == nil {
			err = w.Release(ctx)
		}
		got <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := h.Entries(ctx, backend.Key("t", "x")); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := tries2(); n != 1 {
		t.Fatalf("StoreTries of a queued waiter = %d, want 1", n)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock")
	}
	if n := tries2(); n != 2 {
		t.Fatalf("StoreTries of a waiter granted after one release = %d, want 2", n)
	}
	if n := tries1(); n != 1 {
		t.Fatalf("StoreTries of the holder = %d, want still 1", n)
	}
}
