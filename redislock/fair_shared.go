package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// acquireShared is Acquire for a permit, a read or a write, in both
// modes: it joins the object's queue (see scripts/shared_queue.lua) and waits, woken by
// releases and by grants to those ahead, until it is granted in arrival
// order, ctx ends, or every try has failed for retry.Budget. When it
// returns an error it leaves the queue.
func (d *Driver) acquireShared(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if err := checkShared(l); err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	}
	// A writer's name starts with 'w', so that readers behind it wait.
	w := sharedMode(l) + strconv.FormatUint(rand.Uint64(), 36) + ":" + l.Owner
	px := ttlMillis(l.TTL)
	n := attempts.Add(1) // one attempt for the whole wait: a retried try is recognized
	waited := false // a try answered that it queued
	var (
		ch      chan struct{}
		failing retry.Failing
		backoff = retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		timer   = time.NewTimer(0)
	)
	<-timer.C
	defer timer.Stop()
	quit := func(err error) (backend.Grant, error) {
		d.dep.undo(ctx, func(ctx context.Context) { d.dep.leaveShared(ctx, l, n, w) })
		return backend.Grant{}, err
	}
	for {
		sent := time.Now()
		d.tries.Add(1)
		r, err := d.dep.acquireShared(ctx, l, n, px, w, true, true)
		switch {
		case err == nil && r.limit != "":
			return quit(limitMismatch("acquire", r.limit, l.Limit))
		case err == nil && r.v > 0:
			return backend.Grant{Fence: uint64(r.v), TTL: time.Duration(px) * time.Millisecond, Sent: sent, Waited: waited}, nil
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
			// Subscribed after the first try, then try again at once: no
			// release after it is missed (see Acquire).
			ch = make(chan struct{}, 1)
			cancel, err := d.dep.subscribe(ctx, l.Key, ch)
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
		case r.v < 0: // a holder's time runs out then
			pause = min(pause, time.Duration(-r.v)*time.Millisecond+time.Millisecond)
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
