package locker

import (
	"context"
	"errors"
	"testing"
	"time"

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
