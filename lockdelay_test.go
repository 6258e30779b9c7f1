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

// LockDelay's bound: TTL and delay together at most MaxTTL, checked
// before any call.
func TestLockDelayBadInput(t *testing.T) {
	c := newClient(t, memlock.NewStore())
	_, err := c.TryAcquire(context.Background(), "x", locker.TTL(time.Hour), locker.LockDelay(locker.MaxTTL))
	if !errors.Is(err, locker.ErrInvalidTTL) || !strings.Contains(err.Error(), "LockDelay") {
		t.Fatalf("TTL 1h with LockDelay MaxTTL: %v, want ErrInvalidTTL naming LockDelay", err)
	}
	if got := free(t, c, "x"); len(got) != 1 {
		t.Fatal("a refused acquisition took the lock")
	}
}
