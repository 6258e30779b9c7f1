package locker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// wait acquires req, waiting as well as the driver allows: in its native
// queue, or first in this Client's turnstile for the object, woken by the
// store's notifications or this Client's releases, or backing off with
// jitter. It returns the grant and when the successful request was sent.
// A try that failed other than by a refusal is not tried again under its
// token: its fate is unknown, and the driver may be freeing what it took,
// by that token, after the next try. So req may come back with another.
func (c *Client) wait(ctx context.Context, claim *backend.Claim, st *tries) (backend.Grant, time.Time, error) {
	req := *claim
	if c.queues(req.Mode) {
		return c.queue(ctx, req, st)
	}
	obj := objectOf(req.Key, req.Mode)
	// The first try comes before any turnstile while nobody in this
	// Client waits: most acquisitions find the lock free, and need no
	// more. Only where the store notifies releases: the try after the
	// subscription below then catches one made meanwhile, as a release
	// here would be caught otherwise, by a turnstile that did not exist.
	var first error // that try's error, which the loop takes as its first try's
	if c.notifier != nil && c.waiting.Load() == 0 {
		start := time.Now()
		g, err := c.drv.TryAcquire(ctx, req)
		st.tried(err)
		if err == nil {
			return g, start, nil
		}
		first = err
	}
	ts, t := c.join(obj)
	won := false
	defer func() { c.leave(obj, ts, t, won, req.Mode) }()
	woke := WakeFirst // what prompted the next try
	skip := false     // wait before the first try
	if t.ready != nil {
		// Behind this Client's own waiters: the first of them talks to
		// the store, and hands the turn on when it leaves.
		st.contended = true
		select {
		case <-t.ready:
		case <-ctx.Done():
			return backend.Grant{}, time.Now(), c.waitEnded(ctx)
		}
		woke = WakeLocal
	}
	var notified <-chan struct{}
	subscribed := c.notifier == nil
	unsubscribe := func() {}
	defer func() { unsubscribe() }()
	if !subscribed && t.ready != nil {
		// Our turn came from a waiter that may hold the object now: a
		// try would fail until its release, which a subscription made
		// first cannot miss.
		notified, unsubscribe = c.subscribe(ctx, req.Key, st.h)
		subscribed = true
	}
	b := retry.Backoff{Min: c.cfg.backoffMin, Max: c.cfg.backoffMax}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var failing retry.Failing
	for tries := 0; ; tries++ {
		// Watch for local releases before trying, so that none is missed.
		freed := c.freed(obj, ts)
		// The try before joining is the first one here, unless it was
		// refused and a turn waited for since: then it is stale. One that
		// failed otherwise is taken as this try's failure even behind
		// others, so that its token is never tried again.
		reuse := tries == 0 && first != nil && (t.ready == nil || !errors.Is(first, ErrNotAcquired))
		skip = !reuse && (skip || tries == 0 && t.ready != nil && c.heldHere(ts))
		start := time.Now()
		if !skip {
			var g backend.Grant
			var err error
			switch {
			case reuse:
				err = first // made and counted before joining
			case tries == 0 && t.ready == nil:
				// The uncontended path goes straight to the driver, which
				// honours ctx itself; a waiter's tries are guarded.
				g, err = c.drv.TryAcquire(ctx, req)
			default:
				g, err = c.tryAcquire(ctx, req)
			}
			if !reuse {
				st.tried(err)
			}
			refused := errors.Is(err, ErrNotAcquired)
			switch {
			case err == nil:
				won, st.woken = true, woke
				return g, start, nil
			case refused:
				failing.Ok()
			case ctx.Err() != nil:
				return backend.Grant{}, start, c.waitEnded(ctx)
			case backend.Permanent(err) || failing.Fail(start, retry.Budget):
				return backend.Grant{}, start, err
			default:
				// A blip in reaching the store does not end the wait.
				c.storeError(st.h, "acquire", true, err)
				c.cfg.logger.Warn("locker: acquire failed, retrying", "key", req.Key, "err", err)
				// What the try may have left under its token (a grant, a
				// writer's record of waiting, which refuses readers) goes
				// with it: the token is never used again.
				c.releaseLater(req)
				if req.Token, err = newToken(c.cfg.rand); err != nil {
					return backend.Grant{}, start, err
				}
				claim.Token = req.Token
			}
			if !subscribed {
				// Waiting: subscribe, and after a refusal try again at
				// once, so that a release before the subscription is not
				// missed.
				notified, unsubscribe = c.subscribe(ctx, req.Key, st.h)
				subscribed = true
				if notified != nil && refused {
					continue
				}
			}
		}
		skip = false
		d := b.Next()
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return backend.Grant{}, start, c.waitEnded(ctx)
		case <-notified:
			woke = WakeNotified
		case <-freed:
			woke = WakeLocal
		case <-timer.C:
			woke = WakeTimer
		}
	}
}

// queues reports whether the driver's store queues claims in mode m.
func (c *Client) queues(m backend.Mode) bool {
	return c.queuer != nil && c.queuer.QueueModes().Has(m)
}

// queue acquires req in the store's queue (backend.Queuer): it enqueues
// and waits for its turn, riding out failures to reach the store for the
// failure budget and enqueueing again when its entry went with its
// session. A wait that ends without the lock leaves the queue.
func (c *Client) queue(ctx context.Context, req backend.Claim, st *tries) (backend.Grant, time.Time, error) {
	b := retry.Backoff{Min: c.cfg.backoffMin, Max: c.cfg.backoffMax}
	var failing retry.Failing
	var t backend.Ticket
	for {
		start := time.Now()
		var g backend.Grant
		var err error
		if t == nil {
			// Called directly, as every first try: it honours ctx.
			g, t, err = c.queuer.Enqueue(ctx, req)
			st.attempts++
			if err == nil && t == nil {
				return g, start, nil
			}
			if t != nil {
				// Queued (even if the look after it failed): contended.
				st.contended, st.woken = true, WakeQueue
			}
			if err == nil {
				continue
			}
		} else {
			g, err = t.Wait(ctx)
			st.attempts++
			if errors.Is(err, ErrNotAcquired) {
				failing.Ok() // it looked: the store answers
				b.Reset()
				continue
			}
			if err == nil {
				// A lock that lives for TTL from its grant says when
				// that was; a Wait may have lasted longer than the TTL.
				if !g.Sent.IsZero() {
					start = g.Sent
				}
				return g, start, nil
			}
			if errors.Is(err, backend.ErrRequeue) {
				// Gone, with nothing to leave, as the store answered:
				// join again at once.
				t = nil
				failing.Ok()
				b.Reset()
				continue
			}
			// Wait blocks before it looks: its failure is as old as its
			// return, not its call.
			start = time.Now()
		}
		if ctx.Err() == nil && !backend.Permanent(err) && !failing.Fail(start, retry.Budget) {
			// A blip in reaching the store does not end the wait.
			c.storeError(st.h, "acquire", true, err)
			c.cfg.logger.Warn("locker: acquire failed, retrying", "key", req.Key, "err", err)
			if b.Pause(ctx) {
				continue
			}
		}
		if t != nil {
			c.leaveQueue(ctx, t)
		}
		if ctx.Err() != nil {
			return backend.Grant{}, start, c.waitEnded(ctx)
		}
		return backend.Grant{}, start, err
	}
}

// leaveQueue takes t out of its queue, within CancelGrace of the caller's
// giving up, and finishes in the background after that.
func (c *Client) leaveQueue(ctx context.Context, t backend.Ticket) {
	c.within(time.Now().Add(backend.CancelGrace), func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeReleaseTimeout)
		defer cancel()
		_ = t.Leave(lctx)
	})
}

// subscribe subscribes to key's release notifications, and returns a nil
// channel when it cannot: waiting still works, only slower.
func (c *Client) subscribe(ctx context.Context, key string, h *hold) (<-chan struct{}, func()) {
	sub, err := guard(c, ctx, func(ctx context.Context) (subscription, error) {
		ch, cancel, err := c.notifier.Subscribe(ctx, key)
		return subscription{ch, cancel}, err
	}, func(s subscription) { s.cancel() })
	if err != nil {
		if ctx.Err() == nil {
			c.storeError(h, "subscribe", true, err)
			c.cfg.logger.Warn("locker: release notifications unavailable, polling", "key", key, "err", err)
		}
		return nil, func() {}
	}
	return sub.ch, sub.cancel
}

// subscription is what Notifier.Subscribe returns.
type subscription struct {
	ch     <-chan struct{}
	cancel func()
}

// waitEnded says why a wait ended early: the Client closed, or the
// caller's context ended.
func (c *Client) waitEnded(ctx context.Context) error {
	if c.gate.Closed() {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrNotAcquired, context.Cause(ctx))
}
