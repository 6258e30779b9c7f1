package redislock

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// FairDriver is a Driver whose waiters are served in arrival order: a
// blocked acquisition joins a queue kept next to the lock, and a free lock
// goes to the longest-waiting live waiter only (backend.Queuer).
//
// Every client of a name must use the same mode: a plain Driver's
// TryAcquire does not look at the queue.
//
// Fairness costs throughput under contention (the lock is idle from its
// release until the head of the queue, and only the head, tries again) and
// one extra key per waiter while it waits; a lost release message delays
// the head by up to a third of livenessTTL, not for good.
type FairDriver struct {
	*Driver
}

var _ backend.Queuer = (*FairDriver)(nil)

// livenessTTL is how long a waiter that stopped renewing keeps its place.
// A waiter renews it on every try, at least every livenessTTL/3; a waiter
// that died is dropped when it reaches the head, so it holds the queue up
// for at most this long.
const livenessTTL = 2 * time.Second

// NewFair returns a FairDriver that uses rdb, as New does, and fails as
// New does.
func NewFair(rdb redis.UniversalClient, opts ...Option) (*FairDriver, error) {
	d, err := newDriver(rdb, true, opts)
	if err != nil {
		return nil, err
	}
	return &FairDriver{d}, nil
}
