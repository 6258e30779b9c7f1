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
// queue, woken by its notifications, or backing off with jitter. It returns
// the grant and when the successful request was sent.
func (c *Client) wait(ctx context.Context, req backend.Claim, st *tries) (backend.Grant, time.Time, error) {
	if c.waiter != nil {
		start := time.Now()
		// Called directly: an uncontended Acquire ends here, and a native
		// queue honours ctx itself (see backend.Waiter).
		g, err := c.waiter.Acquire(ctx, req)
		st.attempts, st.woken, st.contended = 1, WakeQueue, g.Waited
		if err != nil && ctx.Err() != nil {
			err = c.waitEnded(ctx)
		}
		// The lock's TTL runs from the request that took it, not from the
		// start of a wait that may have lasted longer than the TTL.
		if err == nil && g.Sent.After(start) {
			start = g.Sent
		}
		return g, start, err
	}
	var notified <-chan struct{}
	if c.notifier != nil {
		// A free lock needs no subscription: try once first. The loop
		// tries again after subscribing, so no release is missed.
		start := time.Now()
		g, err := c.drv.TryAcquire(ctx, req)
		st.tried(err)
		if err == nil {
			return g, start, nil
		}
		sub, err := guard(c, ctx, func(ctx context.Context) (subscription, error) {
			ch, cancel, err := c.notifier.Subscribe(ctx, req.Key)
			return subscription{ch, cancel}, err
		}, func(s subscription) { s.cancel() })
		ch, cancel := sub.ch, sub.cancel
		if err != nil {
			// Waiting still works without notifications, only slower.
			c.storeError(st.h, "subscribe", true, err)
			c.cfg.logger.Warn("locker: release notifications unavailable, polling", "key", req.Key, "err", err)
		} else {
			defer cancel()
			notified = ch
		}
	}
	b := retry.Backoff{Min: c.cfg.backoffMin, Max: c.cfg.backoffMax}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var failing retry.Failing
	woke := WakeFirst // what prompted the next try
	for tries := 0; ; tries++ {
		// Look at local releases before trying, so none is missed.
		local, unwatch := c.watchLocal(req.Key)
		start := time.Now()
		var g backend.Grant
		var err error
		if tries == 0 && notified == nil {
			// The uncontended path goes straight to the driver, which
			// honours ctx itself; a waiter's tries are guarded.
			g, err = c.drv.TryAcquire(ctx, req)
		} else {
			g, err = c.tryAcquire(ctx, req)
		}
		st.tried(err)
		if err == nil {
			unwatch()
			st.woken = woke
			return g, start, nil
		}
		switch {
		case errors.Is(err, ErrNotAcquired):
			failing.Ok()
		case ctx.Err() != nil:
			unwatch()
			return backend.Grant{}, start, c.waitEnded(ctx)
		case backend.Permanent(err) || failing.Fail(start, retry.Budget):
			unwatch()
			return backend.Grant{}, start, err
		default:
			// A blip in reaching the store does not end the wait.
			c.storeError(st.h, "acquire", true, err)
			c.cfg.logger.Warn("locker: acquire failed, retrying", "key", req.Key, "err", err)
		}
		d := b.Next()
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			unwatch()
			return backend.Grant{}, start, c.waitEnded(ctx)
		case <-notified:
			woke = WakeNotified
		case <-local:
			woke = WakeLocal
		case <-timer.C:
			woke = WakeTimer
		}
		unwatch()
	}
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

// localWaiters lets waiters in this process learn of a release by this
// Client without a round trip to the store.
type localWaiters struct {
	ch      chan struct{} // closed at the next release of the key
	waiters int
}

// watchLocal returns a channel closed when a hold on key is next released by
// this Client, and a func to call when no longer watching. On a backend
// that notifies releases, every waiter, here or elsewhere, hears of them
// the same way, so local waiters get no head start: the channel is nil.
func (c *Client) watchLocal(key string) (<-chan struct{}, func()) {
	if c.notifier != nil {
		return nil, func() {}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.released[key]
	if w == nil {
		w = &localWaiters{ch: make(chan struct{})}
		c.released[key] = w
	}
	w.waiters++
	return w.ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if w.waiters--; w.waiters == 0 && c.released[key] == w {
			delete(c.released, key)
		}
	}
}
