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

var _ backend.Waiter = (*Driver)(nil)

// Acquire implements backend.Waiter. A free lock costs one script, as
// TryAcquire. A held one: the waiter joins the lock's queue, and the
// holder's release hands the lock straight to the longest-waiting live
// waiter, which learns it from the release message without another round
// trip (see scripts/handoff.lua). While waiters are queued the lock is
// never free, so a newcomer's try cannot take it first: waiters are served
// in arrival order, except that a lock whose holder's TTL ran out goes to
// whoever tries first. It waits until it holds the lock, ctx ends, or
// every try has failed to reach the server for retry.Budget; when it
// returns an error it leaves the queue and hands on a lock handed to it.
func (d *Driver) Acquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	if l.Mode != backend.Exclusive {
		return d.acquireShared(ctx, l)
	}
	dep := d.dep
	px := ttlMillis(l.TTL)
	first := attempts.Add(1)
	if !dep.channelActive(l.Key) {
		// Not contended a moment ago: first the plain try, as TryAcquire,
		// with nothing of the queue to send, look at or set up. A later
		// try, with a later attempt, takes over what this one may have
		// left.
		sent := time.Now()
		d.tries.Add(1)
		r, err := dep.acquire(ctx, l, l.Token+"."+strconv.FormatUint(first, 10), px)
		if err == nil && r > 0 {
			return backend.Grant{Fence: uint64(r), TTL: time.Duration(px) * time.Millisecond, Sent: sent}, nil
		}
		return d.wait(ctx, l, px, first, sent, err)
	}
	return d.wait(ctx, l, px, first, time.Time{}, nil)
}

// wait is Acquire after its plain try, if it made one (sent, with its
// error; zero when it did not): it queues and waits.
func (d *Driver) wait(ctx context.Context, l backend.Claim, px int64, first uint64, sent time.Time, err error) (backend.Grant, error) {
	refused := !sent.IsZero() // the plain try found it held
	dep := d.dep
	// The waiter's name in the queue and in hand-offs, unique among the
	// lock's waiters; its owner follows, for Inspect and the lock's value.
	w := strconv.FormatUint(rand.Uint64(), 36) + ":" + l.Owner
	var (
		ch      = make(chan struct{}, 1)
		sub     *subscription
		cancel  func()
		failing retry.Failing
		backoff = retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		timer   *time.Timer
		// Set when the wait's one subscription failed: it polls, its
		// tries paced by poll, which "queued" answers do not reset.
		polling bool
		poll    = retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		// The attempt of the latest try the server answered "queued",
		// and when it was sent: a hand-off to it came after that.
		queuedAt   uint64
		queuedSent time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	quit := func(err error) (backend.Grant, error) {
		dep.undo(ctx, func(ctx context.Context) { dep.handoffLeave(ctx, l, first, w) })
		return backend.Grant{}, err
	}
	unsubscribed := func(err error) {
		polling = true
		dep.log.Warn("redislock: release notifications unavailable, polling", "key", l.Key, "err", err)
	}
	n := first
	if sent.IsZero() {
		// A lock contended a moment ago has its channel still subscribed:
		// wait on it from the first try, which then needs no second.
		sub, cancel = dep.subscribeActive(l.Key, w, ch)
	} else {
		switch {
		case ctx.Err() != nil:
			return quit(d.ended(ctx))
		case err != nil && backend.Permanent(err):
			return quit(fmt.Errorf("redislock: %w", err))
		case err != nil:
			failing.Fail(sent, retry.Budget)
		}
		n = attempts.Add(1)
		// Subscribed before joining the queue, no hand-off is missed.
		var serr error
		sub, cancel, serr = dep.subscribeSub(ctx, l.Key, w, ch)
		if serr != nil {
			if ctx.Err() != nil {
				return quit(d.ended(ctx))
			}
			unsubscribed(serr)
		}
	}
	if sub != nil {
		defer cancel()
	}
	for {
		sent := time.Now()
		d.tries.Add(1)
		r, err := dep.handoffAcquire(ctx, l, l.Token+"."+strconv.FormatUint(n, 10), px, w, queuedAt != 0 || n != first)
		switch {
		case err == nil && r > 0:
			return backend.Grant{Fence: uint64(r), TTL: time.Duration(px) * time.Millisecond, Sent: sent, Waited: refused || queuedAt != 0}, nil
		case ctx.Err() != nil:
			return quit(d.ended(ctx))
		case err == nil:
			failing.Ok()
			backoff.Reset()
			queuedAt, queuedSent = n, sent
		case backend.Permanent(err) || failing.Fail(sent, retry.Budget):
			return quit(fmt.Errorf("redislock: %w", err))
		}
		n = attempts.Add(1)
		if sub == nil && !polling {
			// Subscribed after the first try, then try again at once: a
			// hand-off before the subscription was confirmed is taken over
			// by that try. Once per wait: a subscription that failed is not
			// tried again, and the waiter polls.
			var err error
			sub, cancel, err = dep.subscribeSub(ctx, l.Key, w, ch)
			if err == nil {
				defer cancel()
				continue
			}
			if ctx.Err() != nil {
				return quit(d.ended(ctx))
			}
			unsubscribed(err)
		}
		// Renews the entry, and keeps the latest "queued" try recent: a
		// hand-off's Sent is that try's, and the TTL counts from it.
		pause := max(min(livenessTTL/3, time.Duration(px)*time.Millisecond/4), minRenewal)
		switch {
		case err != nil:
			pause = backoff.Next()
		case r < 0: // a restarted server grants it then
			pause = min(pause, time.Duration(-r)*time.Millisecond+time.Millisecond)
		}
		if polling {
			// Without wake-ups a try takes over a hand-off, only later.
			pause = min(pause, poll.Next())
		}
		if timer == nil {
			timer = time.NewTimer(pause)
		} else {
			timer.Reset(pause)
		}
		select {
		case <-ctx.Done():
			return quit(d.ended(ctx))
		case <-ch:
			timer.Stop()
			if f, ok := dep.handedTo(sub, queuedAt); ok {
				// The lock's TTL runs from the release, after queuedSent.
				return backend.Grant{Fence: f, TTL: time.Duration(px) * time.Millisecond, Sent: queuedSent, Waited: true}, nil
			}
		case <-timer.C:
		}
	}
}

// minRenewal bounds how often a waiter of a lock with a tiny TTL renews.
const minRenewal = 5 * time.Millisecond

// handedTo returns the fence of a hand-off to attempt, if sub received
// one. A hand-off to an earlier attempt is stale (a later try was queued
// after it, so that lock has gone), and a later attempt's try has not been
// answered "queued": such a hand-off is taken over by the next try.
func (dep *deployment) handedTo(sub *subscription, attempt uint64) (uint64, bool) {
	dep.mu.Lock()
	defer dep.mu.Unlock()
	for _, h := range sub.handed {
		if h.attempt == attempt && attempt != 0 {
			return h.fence, true
		}
	}
	sub.handed = sub.handed[:0]
	return 0, false
}

// ended is the error of a wait that ctx or Close ended: not acquired, and
// why. (The locker Client reports its own in place of it.)
func (d *Driver) ended(ctx context.Context) error {
	if d.gate.Closed() {
		return fmt.Errorf("redislock: %w", backend.ErrClosed)
	}
	return fmt.Errorf("redislock: %w: %w", backend.ErrNotAcquired, context.Cause(ctx))
}

// handoffKeys returns the default mode scripts' keys for key, and its
// release channel.
func handoffKeys(key string) ([]string, string) {
	k := keysFor(key)
	return []string{k.lock, k.fence, k.queue, k.live, k.hand}, k.channel
}

// handoffAcquire runs a waiter's try (see handoff_acquire.lua): the fence;
// 0 when queued; -n when a restarted server refuses the name for n
// milliseconds.
func (dep *deployment) handoffAcquire(ctx context.Context, l backend.Claim, value string, px int64, w string, queued bool) (int64, error) {
	defer dep.in.watch(ctx).stop()
	q := "0"
	if queued {
		q = "1"
	}
	ks, _ := handoffKeys(l.Key)
	v, err := handoffAcquireScript.Run(ctx, dep.rdb, ks, value, px, holder(l), w, livenessTTL.Milliseconds(), q,
		dep.restartDelay(px), dep.retention, l.Owner).Int64()
	return v, classify(err)
}

// handoffRelease is release that hands the lock to the first live waiter;
// a waiter of this process learns it from the reply, ahead of pub/sub.
func (dep *deployment) handoffRelease(ctx context.Context, l backend.Claim) (bool, error) {
	stop := dep.in.watch(ctx).stop
	ks, channel := handoffKeys(l.Key)
	r, err := handoffReleaseScript.Run(ctx, dep.rdb, ks, holder(l), channel, "0", dep.retention).Result()
	stop()
	if err != nil {
		return false, classify(err)
	}
	switch r := r.(type) {
	case int64:
		return dep.released(r), nil
	case []any:
		if len(r) == 2 {
			code, _ := r[0].(int64)
			msg, _ := r[1].(string)
			dep.handLocal(l.Key, msg)
			return dep.released(code), nil
		}
	}
	return false, fmt.Errorf("unexpected answer %v", r)
}

// handLocal delivers hand-off message msg to its waiter if it waits in this
// process, as the hub does when the message comes (then a second time,
// which handedTo ignores once the waiter returned).
func (dep *deployment) handLocal(key, msg string) {
	to, h, ok := parseHandoff(msg)
	if !ok {
		return
	}
	channel := keysFor(key).channel
	route := ""
	if dep.ring {
		route = channel
	}
	dep.mu.Lock()
	var found *subscription
	if hb := dep.hubs[route]; hb != nil {
		if st := hb.chans[channel]; st != nil {
			for s := range st.subs {
				if s.id == to {
					found = s
					s.addHanded(h)
					break
				}
			}
		}
	}
	dep.mu.Unlock()
	if found != nil {
		notify(found.ch)
	}
}

// handoffCleanup is cleanup for the default mode: the failed attempt's
// lock, if it took it, goes to the first live waiter.
func (dep *deployment) handoffCleanup(ctx context.Context, l backend.Claim, value string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.watch(ctx).stop()
	ks, channel := handoffKeys(l.Key)
	_ = handoffReleaseScript.Eval(ctx, dep.rdb, ks, value, channel, "1", dep.retention).Err()
}

// handoffLeave takes waiter w out of l.Key's queue, even when ctx is done,
// and hands on the lock if an attempt of the wait (from first on) holds
// it. Best effort: a waiter that could not leave is skipped once its
// entry's liveness runs out, and a lock handed to it runs out with its TTL.
func (dep *deployment) handoffLeave(ctx context.Context, l backend.Claim, first uint64, w string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.watch(ctx).stop()
	// EVAL, as every clean-up (see cleanup).
	ks, channel := handoffKeys(l.Key)
	_ = handoffLeaveScript.Eval(ctx, dep.rdb, ks, holder(l), strconv.FormatUint(first, 10), channel, w,
		dep.retention).Err()
}
