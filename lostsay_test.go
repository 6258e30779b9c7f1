package locker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// unanswered never answers a Refresh, but honours its context, as a store
// that is cut off behind a client library that does.
type unanswered struct{ backend.Driver }

func (d unanswered) Refresh(ctx context.Context, l backend.Claim) error {
	<-ctx.Done()
	return ctx.Err()
}

// A Refresh with a live context that the lock's own deadline cuts short
// reports the loss (ErrLost, Lost closed) before it returns, not the bare
// deadline error of a context the caller never set.
func TestRefreshCutByTheLocksDeadlineIsALoss(t *testing.T) {
	c := newClientOn(t, unanswered{memDriver(memlock.NewStore())})
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	err = l.Refresh(context.Background())
	select {
	case <-l.Lost():
	default:
		t.Fatalf("Refresh returned %v past the lock's deadline, and Lost is still open", err)
	}
	if !errors.Is(err, locker.ErrLost) || !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh cut by the lock's deadline = %v, want ErrLost and ErrNotHeld", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Refresh with a live context = %v: the Client's own deadline leaked out", err)
	}
	if !errors.Is(l.Err(), locker.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
}

// A caller's own deadline stays the caller's: a Refresh it cuts reports
// that deadline, and the lock, whose deadline is far, is not lost.
func TestRefreshCutByTheCallersDeadlineIsNoLoss(t *testing.T) {
	c := newClientOn(t, unanswered{memDriver(memlock.NewStore())})
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(time.Minute), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Refresh(ctx); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, locker.ErrLost) {
		t.Fatalf("Refresh past the caller's deadline = %v, want DeadlineExceeded and no loss", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err = %v after the caller's deadline cut a refresh", err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A Release that finds the lock gone from the store (it expired there, or
// was broken or taken over) reports the loss: Lost closed before it
// returns, and an error wrapping ErrLost as well as ErrNotHeld. Do joins
// that loss to its function's result.
func TestReleaseFindingTheLockGoneIsALoss(t *testing.T) {
	s := memlock.NewStore()
	c := newClient(t, s)
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "x", locker.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Expire(backend.Key("locker", "x")) {
		t.Fatal("the store had no lock to expire")
	}
	err = l.Release(ctx)
	select {
	case <-l.Lost():
	default:
		t.Fatalf("Release found the lock gone (%v), and Lost is still open", err)
	}
	if !errors.Is(err, locker.ErrNotHeld) || !errors.Is(err, locker.ErrLost) {
		t.Fatalf("Release of a lock gone from the store = %v, want ErrNotHeld and ErrLost", err)
	}
	if !errors.Is(l.Err(), locker.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}

	err = c.Do(ctx, "y", func(context.Context) error {
		s.Expire(backend.Key("locker", "y"))
		return nil
	}, locker.TTL(time.Minute))
	if !errors.Is(err, locker.ErrLost) {
		t.Fatalf("Do whose lock was gone at its release = %v, want ErrLost", err)
	}
}

// A lock set's Release that finds one of its locks gone reports the loss
// as Lock.Release does: the set's Lost is closed, asked for before the
// Release or after.
func TestLockSetReleaseFindingALockGoneIsALoss(t *testing.T) {
	s := memlock.NewStore()
	c := newClient(t, s)
	ctx := context.Background()
	for _, before := range []bool{true, false} {
		set, err := c.AcquireAll(ctx, []string{"a", "b"}, locker.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		var lost <-chan struct{}
		if before {
			lost = set.Lost()
		}
		if !s.Expire(backend.Key("locker", "b")) {
			t.Fatal("the store had no lock to expire")
		}
		err = set.Release(ctx)
		if !before {
			lost = set.Lost()
		}
		select {
		case <-lost:
		default:
			t.Fatalf("Lost asked for before the Release %v: the Release found b gone (%v), and Lost is still open", before, err)
		}
		if !errors.Is(err, locker.ErrLost) || !errors.Is(set.Err(), locker.ErrLost) {
			t.Fatalf("Release = %v, Err = %v; want ErrLost", err, set.Err())
		}
	}
}
