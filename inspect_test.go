package locker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// plain hides memlock's optional interfaces: a driver that cannot inspect.
type plain struct{ d backend.Driver }

func (p plain) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	return p.d.TryAcquire(ctx, c)
}
func (p plain) Refresh(ctx context.Context, c backend.Claim) error { return p.d.Refresh(ctx, c) }
func (p plain) Release(ctx context.Context, c backend.Claim) error { return p.d.Release(ctx, c) }
func (p plain) Close() error                                       { return p.d.Close() }

func TestOperatorCallsTypedErrors(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	if _, err := c.Inspect(ctx, ""); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("Inspect(\"\") = %v, want ErrInvalidName", err)
	}
	if _, err := c.List(ctx, "a\x00"); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("List with NUL = %v, want ErrInvalidName", err)
	}
	if _, err := c.ForceRelease(ctx, "\xff", 1); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("ForceRelease of invalid UTF-8 = %v, want ErrInvalidName", err)
	}
	if _, err := c.ForceRelease(ctx, "free", 1); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("ForceRelease of a free lock = %v, want ErrNotHeld", err)
	}
	if _, err := c.ForceRelease(ctx, "free", 1, locker.Semaphore(0)); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("ForceRelease of a free semaphore = %v, want ErrNotHeld", err)
	}
	if st, err := c.Inspect(ctx, "free", locker.Write()); err != nil || st.Held || !st.Known.Has(locker.KnowsHolders) {
		t.Errorf("Inspect of a free read-write lock = %+v, %v", st, err)
	}
	for _, n := range []int{-1, locker.MaxLimit + 1} {
		if err := c.Resize(ctx, "x", n); !errors.Is(err, locker.ErrInvalidLimit) {
			t.Errorf("Resize to %d = %v, want ErrInvalidLimit", n, err)
		}
	}
	if err := c.Resize(ctx, "", 2); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("Resize of \"\" = %v, want ErrInvalidName", err)
	}

	bare, err := locker.New(plain{memDriver(memlock.NewStore())})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := bare.Inspect(ctx, "x"); !errors.Is(err, locker.ErrUnsupported) {
		t.Errorf("Inspect without an Inspector = %v, want ErrUnsupported", err)
	}
	if _, err := bare.List(ctx, ""); !errors.Is(err, locker.ErrUnsupported) {
		t.Errorf("List without a Lister = %v, want ErrUnsupported", err)
	}
	if _, err := bare.ForceRelease(ctx, "x", 1); !errors.Is(err, locker.ErrUnsupported) {
		t.Errorf("ForceRelease without a Breaker = %v, want ErrUnsupported", err)
	}
	if err := bare.Resize(ctx, "x", 2); !errors.Is(err, locker.ErrUnsupported) {
		t.Errorf("Resize without a Resizer = %v, want ErrUnsupported", err)
	}
	c.Close()
	if _, err := c.Inspect(ctx, "x"); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Inspect after Close = %v, want ErrClosed", err)
	}
}
