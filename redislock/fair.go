package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// FairDriver is a Driver whose waiters are served in arrival order: a
// blocked Acquire joins a queue kept next to the lock, and a free lock goes
// to the longest-waiting live waiter only. It implements backend.Waiter.
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

var _ backend.Waiter = (*FairDriver)(nil)

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

// Acquire implements backend.Waiter: it joins l.Key's queue and waits,
// woken by the release that names it as the next holder, until it holds
// the lock, ctx ends, or every try has failed to reach the server for
// retry.Budget (backend.StoreFailureBudget). When it returns an error it
// leaves the queue.
func (d *FairDriver) Acquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	if l.Mode != backend.Exclusive {
		return d.acquireShared(ctx, l)
	}
	// The waiter's name in the queue and in wake-ups: unique among the
	// lock's waiters, and not the token, which stays secret; its owner
	// follows, for Inspect.
	w := strconv.FormatUint(rand.Uint64(), 36) + ":" + l.Owner
	px := ttlMillis(l.TTL)
	value := attempt(l) // one attempt for the whole wait: a retried try is recognized
	return d.waitInQueue(ctx, queuedWaiter{
		px: px,
		try: func() (int64, error, error) {
			r, err := d.dep.fairAcquire(ctx, l, value, px, w, true)
			return r, nil, err
		},
		subscribe: func(ch chan struct{}) (func(), error) { return d.dep.subscribeAs(ctx, l.Key, w, ch) },
		leave:     func(ctx context.Context) { d.dep.leave(ctx, l, value, w) },
	})
}
