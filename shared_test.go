package locker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// exclusiveOnly hides memlock's modes, as a driver without them would.
type exclusiveOnly struct{ backend.Driver }

func TestModesNeedTheDriver(t *testing.T) {
	ctx := context.Background()
	d, _ := memlock.New(memlock.NewStore())
	c, err := locker.New(exclusiveOnly{d})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, opt := range []locker.LockOption{locker.Semaphore(2), locker.Read(), locker.Write()} {
		if _, err := c.TryAcquire(ctx, "x", opt); !errors.Is(err, locker.ErrUnsupported) {
			t.Errorf("TryAcquire on a driver without modes = %v, want ErrUnsupported", err)
		}
	}
	for _, n := range []int{0, -1, locker.MaxLimit + 1} {
		if _, err := c.TryAcquire(ctx, "x", locker.Semaphore(n)); !errors.Is(err, locker.ErrInvalidLimit) {
			t.Errorf("Semaphore(%d) = %v, want ErrInvalidLimit", n, err)
		}
	}
}

// countsGrants is a driver with semaphores that is no backend.Weigher,
// and fails the test if a claim reaches it.
type countsGrants struct {
	backend.Driver
	backend.Modal
	t *testing.T
}

func (d countsGrants) TryAcquire(context.Context, backend.Claim) (backend.Grant, error) {
	d.t.Error("a claim reached the driver")
	return backend.Grant{}, backend.ErrUnsupported
}

// TestPermitsChecked: a bad Permits, or one above 1 on a driver that
// counts grants, is refused before any network call.
func TestPermitsChecked(t *testing.T) {
	ctx := context.Background()
	d, _ := memlock.New(memlock.NewStore())
	c, err := locker.New(countsGrants{d, d, t})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, opts := range [][]locker.LockOption{
		{locker.Semaphore(3), locker.Permits(0)},
		{locker.Semaphore(3), locker.Permits(4)},
		{locker.Semaphore(3), locker.Permits(-1)},
		{locker.Permits(1)},
		{locker.Permits(2), locker.Read()},
	} {
		if _, err := c.TryAcquire(ctx, "x", opts...); !errors.Is(err, locker.ErrInvalidLimit) {
			t.Errorf("TryAcquire with %d options = %v, want ErrInvalidLimit", len(opts), err)
		}
	}
	if _, err := c.TryAcquire(ctx, "x", locker.Permits(2), locker.Semaphore(3)); !errors.Is(err, locker.ErrUnsupported) {
		t.Errorf("Permits(2) on a driver that is no Weigher = %v, want ErrUnsupported", err)
	}
}

// TestReentrantPermits: a re-entry keeps the permits of the outer hold,
// and asking for another number of them is a mismatch.
func TestReentrantPermits(t *testing.T) {
	ctx := context.Background()
	d, _ := memlock.New(memlock.NewStore())
	c, _ := locker.New(d)
	defer c.Close()
	o, sem := locker.Reentrant("job-7"), locker.Semaphore(3)
	l, err := c.TryAcquire(ctx, "x", sem, locker.Permits(2), o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := c.TryAcquire(ctx, "x", sem, o); !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("re-entry for 1 permit into a hold of 2 = %v, want ErrLimitMismatch", err)
	}
	r, err := c.TryAcquire(ctx, "x", sem, locker.Permits(2), o)
	if err != nil || r.Fence() != l.Fence() {
		t.Fatalf("re-entry for the same 2 permits = %v (fence %d, outer %d), want the outer hold", err, r.Fence(), l.Fence())
	}
	r.Release(ctx)
}

func TestReentrantModes(t *testing.T) {
	ctx := context.Background()
	d, _ := memlock.New(memlock.NewStore())
	c, _ := locker.New(d)
	defer c.Close()
	o := locker.Reentrant("job-7")

	r, err := c.Acquire(ctx, "x", locker.Read(), o)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire(ctx, "x", locker.Read(), o)
	if err != nil || r2.Fence() != r.Fence() {
		t.Fatalf("a key's second read = %v (fence %d, first %d), want a re-entry", err, r2.Fence(), r.Fence())
	}
	if _, err := c.Acquire(ctx, "x", locker.Write(), o); !errors.Is(err, locker.ErrModeConflict) {
		t.Fatalf("a reader asking to write = %v, want ErrModeConflict", err)
	}
	// The owner's lock and semaphore of the same name are other objects.
	l, err := c.TryAcquire(ctx, "x", o)
	if err != nil {
		t.Fatalf("the owner's lock of a name it reads: %v", err)
	}
	p, err := c.TryAcquire(ctx, "x", locker.Semaphore(3), o)
	if err != nil {
		t.Fatalf("the owner's permit of a name it reads: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "x", locker.Semaphore(4), o); !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("the owner's permit under another limit = %v, want ErrLimitMismatch", err)
	}
	for _, h := range []*locker.Lock{r2, r, l, p} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := c.TryAcquire(ctx, "x", locker.Write(), o)
	if err != nil {
		t.Fatalf("write after the reads were released: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "x", locker.Read(), o); !errors.Is(err, locker.ErrModeConflict) {
		t.Fatalf("a writer asking to read = %v, want ErrModeConflict (no downgrade)", err)
	}
	if _, err := c.TryAcquire(ctx, "x", locker.Read()); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("another reader while a writer holds = %v, want ErrNotAcquired", err)
	}
	w.Release(ctx)
}

func ExampleSemaphore() {
	ctx := context.Background()
	c, _ := locker.Open(ctx, "mem://example-semaphore")
	defer c.Close()
	// At most 5 calls to the payment provider at once, across every
	// process that shares the store.
	err := c.Do(ctx, "payment-provider", func(ctx context.Context) error {
		return nil // call it
	}, locker.Semaphore(5))
	if err != nil {
		panic(err)
	}
}

func ExamplePermits() {
	ctx := context.Background()
	c, _ := locker.Open(ctx, "mem://example-permits")
	defer c.Close()
	// 8 GPUs shared by every process; a training job takes 2 of them at
	// once, or waits until 2 are free.
	err := c.Do(ctx, "gpus", func(ctx context.Context) error {
		return nil // train
	}, locker.Semaphore(8), locker.Permits(2))
	if err != nil {
		panic(err)
	}
}

func ExampleWrite() {
	ctx := context.Background()
	c, _ := locker.Open(ctx, "mem://example-rw")
	defer c.Close()
	// Many readers of the catalogue, one writer rebuilding it; a waiting
	// writer holds new readers back.
	_ = c.Do(ctx, "catalogue", func(ctx context.Context) error { return nil }, locker.Read())
	_ = c.Do(ctx, "catalogue", func(ctx context.Context) error { return nil }, locker.Write())
}
