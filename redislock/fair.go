package redislock

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// FairDriver is a Driver whose waiters are served in arrival order: a free
// lock goes to the longest-waiting live waiter only (backend.Queuer).
// Every client of a name must use the same mode: a plain Driver's
// TryAcquire does not look at the queue.
//
// Fairness costs throughput under contention (the lock is idle until the
// head of the queue tries again) and a key per waiter; a lost release
// message delays the head by up to a third of livenessTTL.
type FairDriver struct {
	*Driver
}

// livenessTTL is how long a waiter that stopped renewing keeps its place
// (a waiter renews it at least every livenessTTL/3): a dead waiter holds
// the queue up for at most this long.
const livenessTTL = 2 * time.Second

// NewFair returns a FairDriver that uses rdb, as New does.
func NewFair(rdb redis.UniversalClient, opts ...Option) (*FairDriver, error) {
	d, err := newDriver(rdb, true, opts)
	if err != nil {
		return nil, err
	}
	return &FairDriver{d}, nil
}
