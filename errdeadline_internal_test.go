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
	drv, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(drv, WithDefaultTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "x", AutoRefresh(false))
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

// silent is a session-backed driver whose session was last answered at the
// grant: from then on the store is silent.
type silent struct{ backend.Driver }

func (s silent) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	at := time.Now()
	g, err := s.Driver.TryAcquire(ctx, l)
	g.Contact, g.SessionTTL = func() time.Time { return at }, 100*time.Millisecond
	return g, err
}

// The same for a session-backed lock: past its session's deadline Err
// reports it lost, though the watchdog has not looked.
func TestErrPastSessionDeadlineWithoutWatchdog(t *testing.T) {
	drv, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(silent{drv}, WithDefaultTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	c.dog.unschedule(l.h) // as if its timer had not fired yet
	time.Sleep(150 * time.Millisecond)
	if err := l.Err(); !errors.Is(err, ErrLost) {
		t.Fatalf("Err() past the session's deadline = %v, want ErrLost", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Err() reported the loss but Lost() did not fire")
	}
}
