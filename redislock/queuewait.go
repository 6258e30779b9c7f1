package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// queuedWaiter is one wait in a queue kept in the server: fair mode's for
// a lock (fair.go) and both modes' for permits, reads and writes
// (fair_shared.go).
type queuedWaiter struct {
	px int64
	// try asks the server for the grant, joining or renewing the waiter's
	// place: v > 0 is the grant's fence, v < 0 a place at the head behind a
	// holder whose TTL runs out in -v ms, 0 a place further back. stop,
	// when not nil, ends the wait with that error as it is.
	try func() (v int64, stop, err error)
	// subscribe has the waiter's wake-ups sent to ch.
	subscribe func(ch chan struct{}) (cancel func(), err error)
	// leave takes the waiter's place out of the queue.
	leave func(ctx context.Context)
}

// waitInQueue tries until the server grants the claim, ctx ends, or every try has
// failed to reach the server for retry.Budget. It subscribes after the
// first try, as a free lock needs no subscription, and tries again at once:
// no release after the first try is missed. After that it tries on each
// wake-up, and at least every livenessTTL/3 to renew its place, so that
// without a subscription the waiter still gets its turn, only later. When
// it returns an error it leaves the queue.
func (d *Driver) waitInQueue(ctx context.Context, q queuedWaiter) (backend.Grant, error) {
	quit := func(err error) (backend.Grant, error) {
		d.dep.undo(ctx, q.leave)
		return backend.Grant{}, err
	}
	waited := false // a try answered that it queued
	var (
		ch      chan struct{} // wake-ups; nil before the first try
		failing retry.Failing
		backoff = retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		timer   = time.NewTimer(0)
	)
	<-timer.C
	defer timer.Stop()
	for {
		sent := time.Now()
		d.tries.Add(1)
		v, stop, err := q.try()
		switch {
		case stop != nil:
			return quit(stop)
		case err == nil && v > 0:
			return backend.Grant{Fence: uint64(v), TTL: time.Duration(q.px) * time.Millisecond, Sent: sent, Waited: waited}, nil
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
			ch = make(chan struct{}, 1)
			cancel, err := q.subscribe(ch)
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
		case v < 0: // at the head: look again when the holder's TTL runs out
			pause = min(pause, time.Duration(-v)*time.Millisecond+time.Millisecond)
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
