package locker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Acquire takes the lock on name, waiting until it is free, ctx is done or
// the Client closes. A wait that ends without the lock returns an error
// wrapping ErrNotAcquired and the context's error. While waiting, failures
// to reach the store are retried for up to 5 seconds in a row
// (backend.StoreFailureBudget; native queues included) before
// Acquire returns the error. Input errors (ErrInvalidName, ErrInvalidTTL)
// come before any network call.
func (c *Client) Acquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return c.acquire(ctx, name, true, opts)
}

// TryAcquire takes the lock on name if it is free, and otherwise returns an
// error wrapping ErrNotAcquired at once.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return c.acquire(ctx, name, false, opts)
}

// Do acquires the lock on name (waiting, as Acquire does; WaitAtMost bounds
// the wait alone), runs fn with a context that is cancelled, with the loss
// as its cause, if the lock is lost, and releases the lock on every path,
// panics included. fn finds the Lock, for its fence, with FromContext. It
// returns fn's error, joined with an error wrapping ErrLost if the lock was
// lost while fn ran, or with Release's error. When the lock is not
// acquired, fn does not run and the error wraps ErrNotAcquired.
func (c *Client) Do(ctx context.Context, name string, fn func(context.Context) error, opts ...LockOption) (err error) {
	return c.doEvents(ctx, name, fn, true, opts)
}

// TryDo is Do without waiting: when the lock is held, it returns an error
// wrapping ErrNotAcquired at once and fn does not run. For a job that
// several hosts start and one should run.
func (c *Client) TryDo(ctx context.Context, name string, fn func(context.Context) error, opts ...LockOption) error {
	return c.doEvents(ctx, name, fn, false, opts)
}

func (c *Client) doEvents(ctx context.Context, name string, fn func(context.Context) error, wait bool, opts []LockOption) (err error) {
	o := c.cfg.obs
	if o == nil || o.DoStart == nil && o.DoDone == nil {
		_, err = c.do(ctx, name, fn, wait, opts)
		return err
	}
	ref := c.refOf(name, opts)
	if o.DoStart != nil {
		if x := o.DoStart(ctx, DoStartEvent{LockRef: ref}); x != nil {
			ctx = x
		}
	}
	var l *Lock
	if o.DoDone != nil {
		defer func() { // also when fn panics
			e := DoDoneEvent{LockRef: ref, Err: err}
			if l != nil {
				e.Fence, e.Held = l.Fence(), time.Since(l.h.granted)
			}
			o.DoDone(ctx, e)
		}()
	}
	l, err = c.do(ctx, name, fn, wait, opts)
	return err
}

// refOf is the LockRef of an acquisition of name with opts, for events.
func (c *Client) refOf(name string, opts []LockOption) LockRef {
	lc := lockConfig{label: c.cfg.label}
	for _, o := range opts {
		o(&lc)
	}
	return lc.ref(c, name)
}

// ref is the LockRef of an acquisition of name with lc, before its grant.
func (lc *lockConfig) ref(c *Client, name string) LockRef {
	ref := LockRef{Namespace: c.cfg.namespace, Name: name, Owner: lc.label, Mode: lc.mode.String()}
	if lc.mode == backend.Permit {
		ref.Limit = lc.limit
	}
	return ref
}

// do is Do without its events. It returns the Lock, if it took one.
func (c *Client) do(ctx context.Context, name string, fn func(context.Context) error, wait bool, opts []LockOption) (l *Lock, err error) {
	l, err = c.acquire(ctx, name, wait, opts)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, lockKey{}, l))
	stop := l.h.afterLost(cancel)
	defer func() {
		stop()
		cancel(nil)
		rerr := l.Release(ctx) // it outlives ctx, bounded
		if lost := l.Err(); lost != nil {
			// fn often returns ctx's cause, which is the loss itself.
			if !errors.Is(err, lost) {
				err = errors.Join(err, lost)
			}
		} else {
			err = errors.Join(err, rerr)
		}
	}()
	return l, fn(fctx)
}

type lockKey struct{}

// FromContext returns the Lock that Do holds while it runs fn with ctx, or
// nil.
func FromContext(ctx context.Context) *Lock {
	l, _ := ctx.Value(lockKey{}).(*Lock)
	return l
}

// releaseTimeout bounds a release that outlives its caller's context: past
// the TTL the store frees the lock anyway.
func releaseTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, time.Second), 10*time.Second)
}

func (c *Client) acquire(ctx context.Context, name string, wait bool, opts []LockOption) (l *Lock, err error) {
	var a attempt // on the stack: begin fills it
	begun, err := c.begin(&a, ctx, name, wait, opts)
	if !begun {
		return nil, err
	}
	defer a.end(&l, &err)
	if err != nil || a.l != nil {
		return a.l, err
	}
	grant, start, err := a.try()
	return a.finish(grant, start, err)
}

// attempt is one acquisition from its checks to the store's answer: begin,
// then try (or a lock set's one request for all its names), then finish,
// then end.
type attempt struct {
	c        *Client
	op, name string
	wait     bool
	ctx      context.Context // the gate's, bounded by WaitAtMost
	h        *hold
	req      backend.Claim
	st       tries
	l        *Lock // set by begin on a re-entry
	cancel   context.CancelFunc
	exit     func()                             // the gate's
	observed func(l *Lock, err error, st tries) // AcquireDone's, or nil
}

// begin checks the acquisition and prepares its claim in a. It returns
// false for bad input; otherwise the caller must end a, and try it unless
// begin returned an error or a re-entry (a.l).
func (c *Client) begin(a *attempt, ctx context.Context, name string, wait bool, opts []LockOption) (bool, error) {
	lc := lockConfig{ttl: c.cfg.ttl, label: c.cfg.label}
	if len(opts) > 0 {
		lc = lc.with(opts)
	}
	op := "try-acquire"
	if wait {
		op = "acquire"
	}
	if err := CheckName(name); err != nil {
		return false, fmt.Errorf("locker: %s: %w", op, err)
	}
	if err := CheckTTL(lc.ttl); err != nil {
		return false, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	if err := CheckLabel(lc.label); err != nil {
		return false, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	if lc.minHold > MaxTTL {
		return false, fmt.Errorf("locker: %s %q: %w: MinHold %v, more than %v", op, name, ErrInvalidTTL, lc.minHold, MaxTTL)
	}
	var marker time.Duration // LockDelay's, for a backend.Delayer
	if lc.delay > 0 {
		if lc.delay > MaxTTL-lc.ttl {
			return false, fmt.Errorf("locker: %s %q: %w: TTL %v and LockDelay %v, more than %v together", op, name, ErrInvalidTTL, lc.ttl, lc.delay, MaxTTL)
		}
		if _, session := backend.As[backend.Session](c.drv); session {
			// The session's end takes the lock with it: only the
			// driver's marker can outlast it, and a TTL adds nothing.
			if d, ok := backend.As[backend.Delayer](c.drv); !ok || !d.KeepsDelay() {
				return false, fmt.Errorf("locker: %s %q: LockDelay: %w: locks that live in a session end with it", op, name, ErrUnsupported)
			}
			marker, lc.delay = lc.delay, 0
		}
	} else {
		lc.delay = 0
	}
	if err := c.checkMode(&lc); err != nil {
		return false, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	*a = attempt{c: c, op: op, name: name, wait: wait, cancel: noCancel}
	if wait && lc.waitSet {
		if lc.waitMax <= 0 {
			a.wait = false
		} else {
			// Only the wait: nothing of the hold outlives this call's ctx.
			ctx, a.cancel = context.WithTimeoutCause(ctx, lc.waitMax, fmt.Errorf("waited %v", lc.waitMax))
		}
	}
	ctx, exit, err := c.gate.Enter(ctx)
	if err != nil {
		a.cancel()
		return false, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	a.ctx, a.exit = ctx, exit
	if o := c.cfg.obs; o != nil && (o.AcquireStart != nil || o.AcquireDone != nil) {
		ref := lc.ref(c, name)
		octx := ctx
		if o.AcquireStart != nil {
			if x := o.AcquireStart(ctx, AcquireStartEvent{LockRef: ref, Wait: a.wait}); x != nil {
				octx = x
			}
		}
		if o.AcquireDone != nil {
			began, w := time.Now(), a.wait
			a.observed = func(l *Lock, err error, st tries) {
				if l != nil {
					ref.Fence = l.Fence()
				}
				o.AcquireDone(octx, AcquireDoneEvent{LockRef: ref, Wait: w, Waited: time.Since(began),
					Attempts: st.attempts, Contended: st.contended, Woken: st.woken, Err: err})
			}
		}
	}

	key := backend.Key(c.cfg.namespace, name)
	h, outer, err := c.claim(ctx, key, lc)
	if err != nil {
		return true, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	if outer != nil {
		a.st.woken = WakeReentry
		a.l, err = c.reenter(ctx, outer, op)
		return true, err
	}
	token, err := newToken(c.cfg.rand)
	if err != nil {
		c.abandon(h)
		return true, err
	}
	h.name, h.token, h.auto, h.ttl, h.minHold, h.delay = name, token, !lc.noAuto, lc.ttl, lc.minHold, lc.delay
	a.h, a.st.h = h, h
	a.req = backend.Claim{Key: key, Token: token, TTL: lc.ttl + lc.delay, Owner: lc.label, OnLost: h.lose, Mode: lc.mode, Limit: lc.limit, Weight: lc.weight, Delay: marker}
	return true, nil
}

func noCancel() {}

// end closes the attempt: AcquireDone, the gate, the wait's bound.
func (a *attempt) end(l **Lock, err *error) {
	if a.observed != nil {
		a.observed(*l, *err, a.st)
	}
	a.exit()
	a.cancel()
}

// try is the attempt's request to the store: a wait, or one try.
func (a *attempt) try() (backend.Grant, time.Time, error) {
	if a.wait {
		g, start, err := a.c.wait(a.ctx, &a.req, &a.st)
		a.h.token = a.req.Token
		return g, start, err
	}
	start := time.Now()
	grant, err := a.c.drv.TryAcquire(a.ctx, a.req)
	a.st.tried(err)
	return grant, start, err
}

// finish makes the store's answer the attempt's result: a Lock, or an
// error, after undoing what a failed acquisition may have left.
func (a *attempt) finish(grant backend.Grant, start time.Time, err error) (*Lock, error) {
	c, ctx, h, req, op, name, wait := a.c, a.ctx, a.h, a.req, a.op, a.name, a.wait
	if err != nil {
		c.storeError(h, "acquire", false, err)
		c.abandon(h)
		switch {
		case req.Mode == backend.Write && !(wait && c.queues(req.Mode)):
			// A writer that stops trying withdraws its record of waiting,
			// before readers are told the lock is busy (backend.Modal).
			c.withdraw(ctx, req)
		case ctx.Err() != nil && !(wait && c.queues(req.Mode)):
			// The caller gave up while a request may have been on its
			// way: a grant the store made after that has no holder.
			c.releaseLater(req)
		}
		if !wait && errors.Is(err, ErrNotAcquired) {
			// Held by another, as a rule; a driver that knows of another
			// reason says so (backend.NotAcquiredError).
			var why *backend.NotAcquiredError
			if errors.As(err, &why) {
				return nil, fmt.Errorf("locker: %s %q: %w", op, name, why)
			}
			return nil, fmt.Errorf("locker: %s %q: %w%s", op, name, ErrNotAcquired, c.heldBy(ctx, req))
		}
		if errors.Is(err, ErrNotAcquired) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// A wait that ran out of time (WaitAtMost, the caller's
			// deadline): who it waited for.
			return nil, fmt.Errorf("locker: %s %q: %w%s", op, name, err, c.heldBy(ctx, req))
		}
		return nil, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	if grant.Sent.After(start) {
		start = grant.Sent // the driver queued the request before it sent it
	}
	h.fence, h.contact, h.granted = grant.Fence, grant.Contact, start
	if grant.TTL-h.delay > h.ttl {
		h.ttl = grant.TTL - h.delay
	}
	// A session may be shorter than the lock's TTL: its own timeout counts.
	h.session = h.ttl
	if grant.SessionTTL > 0 {
		h.session = grant.SessionTTL
	}
	// Its deadline before anyone can re-enter it: a re-entry's refresh is
	// bounded by it, and a zero one has passed.
	h.extend(start)
	c.mu.Lock()
	if c.gate.Closed() {
		// Close, which waits for this call, releases it before it closes
		// the driver: a release of its own might come after.
		c.late = append(c.late, h.lock())
		c.mu.Unlock()
		c.abandon(h)
		return nil, fmt.Errorf("locker: %s %q: %w", op, name, ErrClosed)
	}
	h.depth = 1
	h.ok = true
	c.live[h] = struct{}{}
	c.mu.Unlock()
	if h.ready != nil {
		close(h.ready)
	}
	c.dog.schedule(h, start)
	return &h.first, nil
}

// claim returns a new hold for key, or, when lc's Reentrant key already
// holds key's object in this Client, that outer hold with one more level
// counted. Concurrent first acquisitions under one key wait for each other
// rather than for the store, so they cannot block each other.
func (c *Client) claim(ctx context.Context, key string, lc lockConfig) (h, outer *hold, err error) {
	h = c.newHold(key, lc.label, lc.reentrant)
	h.mode, h.limit, h.weight = lc.mode, lc.limit, lc.weight
	if lc.reentrant == "" {
		return h, nil, nil
	}
	k := h.reentryKey()
	for {
		c.mu.Lock()
		prev := c.reentries[k]
		switch {
		case prev == nil:
			c.reentries[k] = h
			c.mu.Unlock()
			return h, nil, nil
		case prev.ok && prev.mode != h.mode:
			c.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: reentrant key %q holds it to %s", ErrModeConflict, lc.reentrant, prev.mode)
		case prev.ok && (prev.limit != h.limit || prev.weight != h.weight):
			c.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: reentrant key %q holds %d of %d permits, asked for %d of %d", ErrLimitMismatch, lc.reentrant, prev.weight, prev.limit, h.weight, h.limit)
		case prev.ok:
			prev.depth++
			c.mu.Unlock()
			return nil, prev, nil
		}
		c.mu.Unlock()
		select {
		case <-prev.ready: // it succeeded, or failed and left the map: look again
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w: %w", ErrNotAcquired, context.Cause(ctx))
		}
	}
}

// checkMode reports a mode the driver does not take, or a bad limit or
// weight; it sets a Permit claim's weight, 1 unless Permits says.
func (c *Client) checkMode(lc *lockConfig) error {
	if lc.weightSet && lc.mode != backend.Permit {
		return fmt.Errorf("%w: Permits(%d) without Semaphore", ErrInvalidLimit, lc.weight)
	}
	switch lc.mode {
	case backend.Exclusive:
		return nil
	case backend.Permit:
		if err := CheckLimit(lc.limit); err != nil {
			return err
		}
		if !lc.weightSet {
			lc.weight = 1
		}
		if lc.weight < 1 || lc.weight > lc.limit {
			return fmt.Errorf("%w: Permits(%d) of a semaphore of %d (want 1 to %d)", ErrInvalidLimit, lc.weight, lc.limit, lc.limit)
		}
		if !c.modes.Has(backend.Permit) {
			return fmt.Errorf("%w: the backend has no semaphores", ErrUnsupported)
		}
		if lc.weight > 1 && !c.weighs {
			return fmt.Errorf("%w: the backend takes one permit per claim, not %d", ErrUnsupported, lc.weight)
		}
	default:
		if !c.modes.Has(lc.mode) {
			return fmt.Errorf("%w: the backend has no read-write locks", ErrUnsupported)
		}
	}
	return nil
}

// withdraw removes what a writer's failed tries left in the store (its
// record of waiting), within CancelGrace of the caller's giving up.
func (c *Client) withdraw(ctx context.Context, req backend.Claim) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backend.CancelGrace)
	defer cancel()
	_ = c.errCall(wctx, func(ctx context.Context) error { return c.drv.Release(ctx, req) })
}

func (c *Client) newHold(key, label, reentrant string) *hold {
	h := &hold{c: c, key: key, label: label, reentrant: reentrant, slot: -1}
	h.first.h = h
	if reentrant != "" {
		// Only re-entries wait for a first acquisition to end.
		h.ready = make(chan struct{})
	}
	return h
}

// abandon forgets a hold whose first acquisition failed.
func (c *Client) abandon(h *hold) {
	c.mu.Lock()
	if h.reentrant != "" && c.reentries[h.reentryKey()] == h {
		delete(c.reentries, h.reentryKey())
	}
	c.mu.Unlock()
	h.mu.Lock()
	h.done = true
	h.mu.Unlock()
	if h.ready != nil {
		select {
		case <-h.ready:
		default:
			close(h.ready)
		}
	}
}

// reenter extends the TTL of a Reentrant key's hold, whose level claim
// counted.
func (c *Client) reenter(ctx context.Context, h *hold, op string) (*Lock, error) {
	err := h.err()
	if err == nil {
		err = c.refreshShared(ctx, h)
	}
	if err != nil {
		// Give the level back; if the outer Lock was released meanwhile,
		// this frees the lock.
		_ = c.release(context.WithoutCancel(ctx), h)
		if lost := h.err(); lost != nil {
			return nil, fmt.Errorf("locker: %s %q: re-entry: %w", op, h.name, lost)
		}
		return nil, fmt.Errorf("locker: %s %q: re-entry: %w", op, h.name, err)
	}
	return &Lock{h: h}, nil
}

// refresh extends h in the store; a proven loss fires Lost.
func (c *Client) refresh(ctx context.Context, h *hold) error {
	start := time.Now()
	err := c.drv.Refresh(ctx, h.lock())
	c.refreshed(h, false, start, err)
	switch {
	case err == nil:
		h.confirmed(start)
		return nil
	case errors.Is(err, ErrNotHeld):
		h.loseBy(LostGone, fmt.Errorf("locker: %q: %w: refresh found it gone", h.name, ErrLost))
		return fmt.Errorf("locker: refresh %q: %w", h.name, err)
	default:
		return fmt.Errorf("locker: refresh %q: %w", h.name, err)
	}
}

// refreshShared refreshes h for a re-entry, joining a refresh that another
// re-entry has in flight rather than racing it: concurrent re-entries of
// one key cost one store call, and a store that checks versions (memcached's
// cas) sees no conflict between them. The shared call is bounded by the
// hold's deadline, not by any one caller's context.
func (c *Client) refreshShared(ctx context.Context, h *hold) error {
	h.mu.Lock()
	f := h.flight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		h.flight = f
		h.mu.Unlock()
		fctx, cancel := context.WithDeadline(c.gate.Context(), h.deadline())
		f.err = c.refresh(fctx, h)
		cancel()
		h.mu.Lock()
		h.flight = nil
		h.mu.Unlock()
		close(f.done)
		return f.err
	}
	h.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return fmt.Errorf("locker: refresh %q: %w", h.name, context.Cause(ctx))
	}
}

// release drops one level of h, and frees it in the store at the last one.
func (c *Client) release(ctx context.Context, h *hold) error {
	lost, free, err := c.letGo(ctx, h)
	if !free {
		return err
	}
	obj := objectOf(h.key, h.mode)
	c.releasing(obj)
	err = c.drv.Release(ctx, h.lock())
	c.released(obj)
	return c.releaseResult(h, lost, err)
}

// letGo ends h's hold in this Client. It returns free when the store's
// Release of h is due, which the caller then makes and hands to releaseResult;
// otherwise the release's result: a re-entry's, or MinHold's linger's.
func (c *Client) letGo(ctx context.Context, h *hold) (lost error, free bool, err error) {
	c.mu.Lock()
	h.depth--
	if h.depth > 0 {
		c.mu.Unlock()
		if lost := h.err(); lost != nil {
			return lost, false, fmt.Errorf("locker: release %q: %w: %w", h.name, ErrNotHeld, lost)
		}
		return nil, false, nil
	}
	if h.reentrant != "" && c.reentries[h.reentryKey()] == h {
		delete(c.reentries, h.reentryKey())
	}
	delete(c.live, h)
	c.mu.Unlock()

	lost = h.err()
	h.mu.Lock()
	h.done = true
	renewing := h.renewing
	h.mu.Unlock()
	c.dog.unschedule(h)
	var rest time.Duration // what MinHold leaves, if it is set: the clock costs
	if h.minHold > 0 {
		rest = h.minHold - time.Since(h.granted)
	}
	if rest > 0 && lost == nil && renewing != nil {
		// The watchdog's refresh must land first: it asks for a whole
		// TTL, the linger for what is left of the minimum.
		select {
		case <-renewing:
		case <-ctx.Done():
		}
		rest = h.minHold - time.Since(h.granted)
	}
	if rest > 0 && lost == nil {
		return lost, false, c.releaseResult(h, lost, c.linger(ctx, h, rest))
	}
	return lost, true, nil
}

// releaseResult makes the store's answer to h's release (or linger) the
// release's result, and reports it.
func (c *Client) releaseResult(h *hold, lost, err error) error {
	var ret error
	switch {
	case lost != nil:
		ret = fmt.Errorf("locker: release %q: %w: %w", h.name, ErrNotHeld, lost)
	case err == nil:
	case errors.Is(err, ErrNotHeld):
		// Gone before this release, so lost while held: said as a
		// refresh would say it.
		h.report(LostGone, fmt.Errorf("locker: %q: %w: the release found it gone: it expired or was taken over", h.name, ErrLost), true)
		ret = fmt.Errorf("locker: release %q: %w: %w", h.name, ErrNotHeld, h.err())
	default:
		ret = fmt.Errorf("locker: release %q: %w (it expires after its TTL)", h.name, err)
	}
	if o := c.cfg.obs; o != nil {
		c.storeError(h, "release", false, err)
		if o.Released != nil {
			o.Released(ReleaseEvent{LockRef: h.ref(), Held: time.Since(h.granted), Err: ret})
		}
	}
	return ret
}

// linger leaves h's lock in the store for rest more, then lets it go
// (MinHold). A lock that lives for a TTL gets one refresh with rest as
// its TTL: the store frees it then, whatever becomes of this process. A
// session-backed lock moves to a lifetime of its own where the driver can
// (backend.Lingerer); otherwise the Client releases it after rest, or at
// Close.
func (c *Client) linger(ctx context.Context, h *hold, rest time.Duration) error {
	cl := h.lock()
	cl.TTL = rest
	if _, ok := backend.As[backend.Session](c.drv); !ok {
		return c.drv.Refresh(ctx, cl)
	}
	if lg, ok := backend.As[backend.Lingerer](c.drv); ok {
		return lg.Linger(ctx, cl)
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		t := time.NewTimer(rest)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.gate.Context().Done(): // Close: the session ends anyway
		}
		c.releaseNow(h.lock())
		c.released(objectOf(h.key, h.mode))
	}()
	return nil
}
