package locker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

func TestWaitAtMostBoundsTheWaitAlone(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	held, err := c.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	began := time.Now()
	err = c.Do(ctx, "job", func(context.Context) error { ran = true; return nil }, locker.WaitAtMost(100*time.Millisecond))
	if took := time.Since(began); !errors.Is(err, locker.ErrNotAcquired) || ran || took < 100*time.Millisecond || took > 2*time.Second {
		t.Fatalf("Do on a held lock with WaitAtMost(100ms) = %v after %v (fn ran: %v), want ErrNotAcquired after 100ms, fn not run", err, took, ran)
	}
	if !strings.Contains(err.Error(), "waited 100ms") {
		t.Errorf("error %q does not say how long it waited", err)
	}
	if _, err := c.Acquire(ctx, "job", locker.WaitAtMost(0)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Acquire with WaitAtMost(0) on a held lock = %v, want ErrNotAcquired", err)
	}
	held.Release(ctx)

	// The bound ends with the wait: fn runs past it, its context alive.
	err = c.Do(ctx, "job", func(ctx context.Context) error {
		time.Sleep(300 * time.Millisecond)
		return ctx.Err()
	}, locker.WaitAtMost(50*time.Millisecond))
	if err != nil {
		t.Fatalf("Do with WaitAtMost(50ms) running 300ms = %v, want nil (fn's context not cut by the wait bound)", err)
	}
	// A TTL of 600ms: the watchdog refreshes every 200ms with 400ms to
	// spare, which a loaded machine does not use up (with 200ms, 133ms).
	l, err := c.Acquire(ctx, "job", locker.WaitAtMost(50*time.Millisecond), locker.TTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1300 * time.Millisecond) // past the bound and two TTLs: the watchdog keeps it
	select {
	case <-l.Lost():
		t.Fatalf("a lock taken with WaitAtMost was lost after the bound: %v", l.Err())
	default:
	}
	l.Release(ctx)
}

func TestTryDo(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	held, err := c.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	began := time.Now()
	err = c.TryDo(ctx, "job", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, locker.ErrNotAcquired) || ran || time.Since(began) > time.Second {
		t.Fatalf("TryDo on a held lock = %v (fn ran: %v, after %v), want ErrNotAcquired at once", err, ran, time.Since(began))
	}
	held.Release(ctx)
	var fence uint64
	if err := c.TryDo(ctx, "job", func(ctx context.Context) error {
		fence = locker.FromContext(ctx).Fence()
		return nil
	}); err != nil || fence == 0 {
		t.Fatalf("TryDo on a free lock = %v, fence %d", err, fence)
	}
	if _, err := c.TryAcquire(ctx, "job"); err != nil {
		t.Fatalf("TryDo left the lock held: %v", err)
	}
}

func TestMinHoldBadInput(t *testing.T) {
	c := newClient(t, memlock.NewStore())
	if _, err := c.TryAcquire(context.Background(), "job", locker.MinHold(locker.MaxTTL+time.Second)); !errors.Is(err, locker.ErrInvalidTTL) {
		t.Fatalf("MinHold past MaxTTL = %v, want ErrInvalidTTL", err)
	}
}
