package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
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
	var (
		ch      chan struct{} // wake-ups naming w; nil before the first try
		failing retry.Failing
		backoff = retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		timer   = time.NewTimer(0)
	)
	<-timer.C
	defer timer.Stop()
	quit := func(err error) (backend.Grant, error) {
		d.dep.undo(ctx, func(ctx context.Context) { d.dep.leave(ctx, l, value, w) })
		return backend.Grant{}, err
	}
	waited := false // a try answered that it queued
	for {
		sent := time.Now()
		d.tries.Add(1)
		r, err := d.dep.fairAcquire(ctx, l, value, px, w, true)
		switch {
		case err == nil && r > 0:
			return backend.Grant{Fence: uint64(r), TTL: time.Duration(px) * time.Millisecond, Sent: sent, Waited: waited}, nil
		case ctx.Err() != nil:
			return quit(d.ended(ctx))
		case err == nil:
			waited = true
			failing.Ok()
			backoff.Reset()
		case backend.Permanent(err) || failing.Fail(sent, retry.Budget):
			return quit(fmt.Errorf("redislock: %w", err))
		}
		if ch == nil {
			// A free lock needs no subscription, so the first try comes
			// before it (and joined the queue if the lock is taken). Once
			// subscribed, try again at once: no release after the first
			// try is missed. Without a subscription the waiter still gets
			// the lock, by its liveness renewals, only later.
			ch = make(chan struct{}, 1)
			cancel, err := d.dep.subscribeAs(ctx, l.Key, w, ch)
			if err == nil {
				defer cancel()
			} else if ctx.Err() != nil {
				return quit(d.ended(ctx))
			}
			continue
		}
		pause := livenessTTL / 3 // renews the liveness
		switch {
		case err != nil:
			pause = backoff.Next()
		case r < 0: // at the head: look again when the holder's TTL runs out
			pause = min(pause, time.Duration(-r)*time.Millisecond+time.Millisecond)
		}
		timer.Reset(pause)
		select {
		case <-ctx.Done():
			return quit(d.ended(ctx))
		case <-ch:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}
