package locker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

// A Release whose context ended and whose store does not answer says
// both: it could not confirm the release, and the caller's context ended.
// It gives up within its own bound (1 s for a lock of 1 s).
func TestReleaseAfterCancelUnconfirmed(t *testing.T) {
	c := newClientOn(t, stuck{memDriver(memlock.NewStore())})
	ctx, cancel := context.WithCancel(context.Background())
	l, err := c.TryAcquire(ctx, "x", locker.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	began := time.Now()
	err = l.Release(ctx)
	took := time.Since(began)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Release = %v, want the caller's cancellation, since the store did not answer", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Release = %v, want its own bound's end too", err)
	}
	if took > 5*time.Second {
		t.Errorf("Release took %v, want about 1s", took)
	}
}

// Refresh, unlike Release, is the caller's alone: with its context ended
// it does not ask the store, and the lock stays as it was.
func TestRefreshAfterCancel(t *testing.T) {
	store := memlock.NewStore()
	c1, c2 := newClient(t, store), newClient(t, store)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := l.Refresh(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Refresh with a cancelled context = %v, want context.Canceled", err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("Err after a refresh not made = %v, want nil", err)
	}
	if _, err := c2.TryAcquire(context.Background(), "x"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("another client's TryAcquire = %v, want ErrNotAcquired: the lock is still held", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release with the cancelled context = %v, want nil", err)
	}
	if l, err := c2.TryAcquire(context.Background(), "x"); err != nil {
		t.Errorf("TryAcquire after the release: %v", err)
	} else {
		l.Release(context.Background())
	}
}
