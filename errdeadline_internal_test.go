package locker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// Err is right at the deadline even when the watchdog is late: a busy
// machine delays its timer, and the store frees the lock on time.
func TestErrPastDeadlineWithoutWatchdog(t *testing.T) {
	errPastDeadline(t, func(d backend.Driver) backend.Driver { return d }, AutoRefresh(false))
}

// The same for a session-backed lock, past its session's deadline.
func TestErrPastSessionDeadlineWithoutWatchdog(t *testing.T) {
	errPastDeadline(t, func(d backend.Driver) backend.Driver { return silent{d} }, TTL(time.Minute))
}

// silent is a session-backed driver whose session was last answered at the
// grant, with a 100ms timeout: from then on the store is silent.
type silent struct{ backend.Driver }

func (s silent) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	at := time.Now()
	g, err := s.Driver.TryAcquire(ctx, l)
	g.Contact, g.SessionTTL = func() time.Time { return at }, 100*time.Millisecond
	return g, err
}

// errPastDeadline takes a lock with a deadline 100ms away on wrap's driver,
// keeps the watchdog from looking at it, and checks Err and Lost past the
// deadline.
func errPastDeadline(t *testing.T, wrap func(backend.Driver) backend.Driver, opts ...LockOption) {
	drv, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(wrap(drv), WithDefaultTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "x", opts...)
	if err != nil {
		t.Fatal(err)
	}
	c.dog.unschedule(l.h) // as if its timer had not fired yet
	time.Sleep(150 * time.Millisecond)
	if err := l.Err(); !errors.Is(err, ErrLost) {
		t.Fatalf("Err() past the deadline = %v, want ErrLost", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Err() reported the loss but Lost() did not fire")
	}
}
