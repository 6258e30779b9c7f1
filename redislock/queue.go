package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// QueueModes implements backend.Queuer: waiters of every mode queue in the
// server, in arrival order (scripts/handoff.lua, fair_acquire.lua and
// shared_queue.lua).
func (d *Driver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// ticket is a claim's place in its key's queue.
type ticket struct {
	d  *Driver
	c  backend.Claim
	px int64
	// w names the waiter in the queue and in wake-ups (it is woken by a
	// message naming it, or no one): unique, and not the secret token. Its
	// owner follows, for Inspect; a writer's starts with 'w', so that
	// readers behind it wait.
	w     string
	first uint64 // the wait's first attempt; the default mode's later looks take later ones
	// last is the latest look's attempt: a Leave frees none after it,
	// which would be the claim's next Enqueue's (the Client's retry under
	// the same token, which a late Leave must not free).
	last uint64
	// queuedAt is the attempt of the latest look answered "queued", sent
	// at queuedSent: a hand-off to it came after. Once set, an entry found
	// gone is not made again.
	queuedAt   uint64
	queuedSent time.Time
	ch         chan struct{} // wake-ups
	sub        *subscription // nil while not subscribed
	cancel     func()
	pause      time.Duration  // at most, before the next look
	poll       *retry.Backoff // not nil when not subscribed (see Wait)
}

// Enqueue implements backend.Queuer. A free lock costs one script: in the
// default mode the plain try, as TryAcquire. Otherwise the waiter
// subscribes to the key's wake-ups and looks again, joining the queue, so
// that none is missed; on a key contended a moment ago, still subscribed,
// the first look joins.
func (d *Driver) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, nil, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	if c.Mode != backend.Exclusive {
		if err := checkShared(c); err != nil {
			return backend.Grant{}, nil, fmt.Errorf("redislock: %w", err)
		}
	}
	// On the stack: a free lock's try needs no ticket; one that waits
	// gets a copy (kept).
	t := ticket{d: d, c: c, px: ttlMillis(c.TTL), first: attempts.Add(1)}
	if !t.handoff() || d.dep.mayBeActive() {
		t.join()
		t.sub, t.cancel = d.dep.subscribeActive(c.Key, t.w, t.ch)
	}
	g, err := t.look(ctx)
	if t.sub == nil && errors.Is(err, backend.ErrNotAcquired) {
		if err = t.subscribe(ctx); err == nil {
			g, err = t.look(ctx)
		}
	}
	switch {
	case err == nil:
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, t.kept(), nil
	case t.queuedAt == 0:
		// What the looks left goes before the claim's next Enqueue.
		left := t.kept()
		d.dep.undo(ctx, func(ctx context.Context) { _ = left.Leave(ctx) })
		return backend.Grant{}, nil, err
	}
	return backend.Grant{}, t.kept(), err
}

// kept is a copy of t that outlives its Enqueue.
func (t *ticket) kept() *ticket {
	k := *t
	return &k
}

// join names the waiter and makes its wake-ups' channel, once it may wait.
func (t *ticket) join() {
	if t.ch != nil {
		return
	}
	t.w = strconv.FormatUint(rand.Uint64(), 36) + ":" + t.c.Owner
	if t.c.Mode != backend.Exclusive {
		if t.c.Weight > 1 {
			// The waiters behind count its permits (scripts/shared_queue.lua).
			t.w = strconv.Itoa(t.c.Weight) + "." + t.w
		}
		t.w = sharedMode(t.c) + t.w
	}
	t.ch = make(chan struct{}, 1)
}

// handoff says whether the claim waits for the default mode's hand-off.
func (t *ticket) handoff() bool { return t.c.Mode == backend.Exclusive && !t.d.fair }

// subscribe subscribes to the key's wake-ups, or has the waiter poll.
func (t *ticket) subscribe(ctx context.Context) error {
	t.join()
	var err error
	t.sub, t.cancel, err = t.d.dep.subscribe(ctx, t.c.Key, t.w, t.ch)
	if err != nil && ctx.Err() == nil {
		t.poll = &retry.Backoff{Min: 25 * time.Millisecond, Max: 250 * time.Millisecond}
		t.d.dep.log.Warn("redislock: release notifications unavailable, polling", "key", t.c.Key, "err", err)
		return nil
	}
	return err
}

// stop ends the subscription.
func (t *ticket) stop() {
	if t.sub != nil {
		t.cancel()
		t.sub = nil
	}
}

// Wait implements backend.Ticket. It looks when woken, and at least every
// livenessTTL/3 to renew its place (the default mode every TTL/4, so that
// a hand-off's TTL counts from a recent look); a default mode waiter
// without wake-ups polls, 25ms to 250ms apart. A hand-off's message is its
// grant, without a look.
func (t *ticket) Wait(ctx context.Context) (backend.Grant, error) {
	ctx, done, err := t.d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	pause := t.pause
	if t.poll != nil && t.handoff() {
		pause = min(pause, t.poll.Next())
	}
	timer := time.NewTimer(pause)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return backend.Grant{}, fmt.Errorf("redislock: %w", context.Cause(ctx))
	case <-t.ch:
		if f, ok := t.d.dep.handedTo(t.sub, t.queuedAt); ok {
			t.stop()
			return backend.Grant{Fence: f, TTL: time.Duration(t.px) * time.Millisecond, Sent: t.queuedSent}, nil
		}
	case <-timer.C:
	}
	return t.look(ctx)
}

// look runs the claim's acquire script once, joining the queue or renewing
// its place when not granted; the default mode's first look is the plain
// try.
func (t *ticket) look(ctx context.Context) (backend.Grant, error) {
	d, c := t.d, t.c
	n, mode := t.first, "wait"
	if t.queuedAt != 0 {
		mode = "look"
	}
	t.pause = livenessTTL / 3
	if t.handoff() {
		t.pause = max(min(t.pause, time.Duration(t.px)*time.Millisecond/4), minRenewal)
		if t.sub != nil || t.poll != nil {
			n = attempts.Add(1) // each look its own: a later one takes over what an earlier left
		}
	}
	t.last = n
	value := attemptValue(c.Token, n)
	sent := time.Now()
	d.tries.Add(1)
	var v int64
	var err error
	switch {
	case c.Mode != backend.Exclusive:
		var r sharedAnswer
		r, err = d.dep.acquireShared(ctx, c, n, t.px, t.w, mode)
		if err == nil && r.limit != "" {
			return backend.Grant{}, limitMismatch("acquire", r, c)
		}
		v = r.v
	case !d.fair && n == t.first: // the default mode's plain try: it joins nothing
		if v, err = d.acquire(ctx, c, value, t.px); err == nil && v == 0 {
			return backend.Grant{}, fmt.Errorf("redislock: %w", backend.ErrNotAcquired)
		}
	default:
		v, err = d.dep.queueAcquire(ctx, d.fair, c, value, t.px, t.w, mode)
	}
	switch {
	case errors.Is(err, redis.Nil):
		t.stop()
		return backend.Grant{}, fmt.Errorf("redislock: %w", backend.ErrRequeue)
	case err != nil:
		t.pause = 0 // a wake-up may have been missed
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	case v > 0:
		t.stop()
		return backend.Grant{Fence: uint64(v), TTL: time.Duration(t.px) * time.Millisecond, Sent: sent}, nil
	case v == 0:
		t.queuedAt, t.queuedSent = n, sent
	default: // at the head, behind a holder whose TTL runs out in -v ms, or a restarted server
		t.pause = min(t.pause, time.Duration(-v)*time.Millisecond+time.Millisecond)
	}
	return backend.Grant{}, fmt.Errorf("redislock: %w", backend.ErrNotAcquired)
}

// minRenewal bounds how often a default mode waiter renews (a tiny TTL).
const minRenewal = 5 * time.Millisecond

// Leave implements backend.Ticket: the entry goes, and so does what any
// look of the wait was granted, a lock handed on to the next waiter.
func (t *ticket) Leave(ctx context.Context) error {
	t.stop()
	t.join() // a ticket that never joined has no entry: any name will do
	switch {
	case t.c.Mode != backend.Exclusive:
		return t.d.dep.leaveShared(ctx, t.c, t.first, t.w)
	case t.d.fair:
		return t.d.dep.leave(ctx, t.c, attemptValue(t.c.Token, t.first), t.w)
	}
	return t.d.dep.handoffLeave(ctx, t.c, t.first, max(t.last, t.first), t.w)
}

// The default mode's queue: a release hands a contended lock to the
// longest-waiting live waiter, in the release message (scripts/handoff.lua).

// handedTo returns the fence of a hand-off to attempt, if sub received
// one. Others are dropped: one to an earlier attempt is stale, and a
// later attempt's is taken over by the next try.
func (dep *deployment) handedTo(sub *subscription, attempt uint64) (uint64, bool) {
	if sub == nil {
		return 0, false
	}
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

// handoffKeys returns the default mode scripts' keys, and the channel.
func handoffKeys(key string) ([]string, string) {
	k := keysFor(key)
	return []string{k.lock, k.fence, k.queue, k.live, k.hand}, k.channel
}

// handoffRelease is release that hands the lock to the first live waiter;
// a waiter of this process learns it from the reply, ahead of pub/sub.
func (dep *deployment) handoffRelease(ctx context.Context, l backend.Claim) (bool, error) {
	ks, _ := handoffKeys(l.Key)
	r, err := dep.run(ctx, handoffReleaseScript, ks, holder(l), dep.retentionArg).Result()
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

// handLocal delivers hand-off message msg to its waiter if it waits in
// this process, ahead of the hub (whose second delivery handedTo ignores).
func (dep *deployment) handLocal(key, msg string) {
	to, h, ok := parseHandoff(msg)
	if !ok {
		return
	}
	channel := keysFor(key).channel
	dep.mu.Lock()
	defer dep.mu.Unlock()
	if hb := dep.hubs[dep.route(channel)]; hb != nil && hb.chans[channel] != nil {
		for s := range hb.chans[channel].subs {
			if s.id == to {
				s.addHanded(h)
				backend.Notify(s.ch)
				break
			}
		}
	}
}

// handoffCleanup is cleanup for the default mode: a lock taken is handed on.
func (dep *deployment) handoffCleanup(ctx context.Context, l backend.Claim, value string) {
	ks, _ := handoffKeys(l.Key)
	_ = dep.evalCleanup(ctx, handoffReleaseScript, ks, value, dep.retentionArg)
}

// handoffLeave takes waiter w out of l.Key's queue and hands on the lock
// if an attempt of the wait (first to last) holds it. Best effort: a
// waiter that could not leave is skipped once its liveness runs out.
func (dep *deployment) handoffLeave(ctx context.Context, l backend.Claim, first, last uint64, w string) error {
	ks, channel := handoffKeys(l.Key)
	return dep.evalCleanup(ctx, handoffLeaveScript, ks, holder(l), strconv.FormatUint(first, 10), channel, w, dep.retentionArg, strconv.FormatUint(last, 10))
}
