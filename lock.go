package locker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// hold is one acquisition in the store. Re-entrant acquisitions share it,
// each with a Lock handle of its own.
type hold struct {
	c     *Client
	name  string
	key   string
	label string // what the store records as the holder (Claim.Owner)
	// reentrant is the Reentrant key that re-entries share, or "".
	reentrant string
	token     string
	mode      backend.Mode
	limit     int // a semaphore's, for Permit
	weight    int // the permits it takes, for Permit
	auto      bool
	// minHold: a release before granted+minHold leaves the lock in the
	// store until then (MinHold).
	minHold time.Duration
	// delay is LockDelay's: the store keeps the lock delay longer than
	// ttl, which is the holder's own view of it.
	delay time.Duration

	// Set once the acquisition succeeds; read-only after ready closes.
	fence   uint64
	ttl     time.Duration
	contact func() time.Time // the session's last answered request; nil unless session-backed
	session time.Duration    // the session's timeout, with contact
	granted time.Time        // when the first acquisition succeeded
	ready   chan struct{}    // closed when the first acquisition ends, either way; nil unless reentrant
	ok      bool             // the first acquisition succeeded
	first   Lock             // the first acquisition's handle, allocated with h

	depth int // guarded by c.mu

	mu         sync.Mutex
	validUntil time.Time     // when the store may free it, judged from our side
	refreshErr error         // the last failed automatic refresh, if the next has not succeeded
	lost       chan struct{} // made when first asked for (Lost)
	lostErr    error
	onLost     []*func(error) // a few at most (Do's)
	done       bool           // released; no loss is reported after that
	flight     *flight        // the refresh in flight for re-entries, or nil
	// renewing is closed when the watchdog's refresh in flight ends; nil
	// when none is. A release that lingers waits for it, so a late
	// full-TTL refresh cannot land after the linger's shorter one.
	renewing chan struct{}

	// Guarded by the watchdog's mutex.
	slot       int       // index in the watchdog's heap, -1 when not scheduled
	due        time.Time // when the watchdog looks at h next
	atDeadline bool      // due is the deadline: no refresh, no early window
}

// flight is one refresh that concurrent re-entries share.
type flight struct {
	done chan struct{}
	err  error
}

// renewed ends the mark of the watchdog's refresh in flight.
func (h *hold) renewed() {
	h.mu.Lock()
	if h.renewing != nil {
		close(h.renewing)
		h.renewing = nil
	}
	h.mu.Unlock()
}

func (h *hold) lock() backend.Claim {
	return backend.Claim{Key: h.key, Token: h.token, TTL: h.ttl + h.delay, Fence: h.fence, Owner: h.label, Mode: h.mode, Limit: h.limit, Weight: h.weight}
}

// reentryKey is where c.reentries keeps h, when h is reentrant.
func (h *hold) reentryKey() reentryKey { return reentryKey{objectOf(h.key, h.mode), h.reentrant} }

// deadline is when the store may free h, judged from our side.
func (h *hold) deadline() time.Time {
	if h.contact != nil {
		return h.sessionUntil()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.validUntil
}

// lose is the driver's report of a loss (backend.Claim.OnLost), which
// does not know the lock's name: the error gets it, as every loss's does.
func (h *hold) lose(err error) {
	if errors.Is(err, ErrLost) {
		err = fmt.Errorf("locker: %q: %w", h.name, err)
	} else {
		err = fmt.Errorf("locker: %q: %w: %w", h.name, ErrLost, err)
	}
	h.loseBy(LostReported, err)
}

// loseBy records that the lock is lost, once, and tells everyone listening.
func (h *hold) loseBy(cause LostCause, err error) { h.report(cause, err, false) }

// report is loseBy; atRelease reports the loss even though h is released
// (done): its release found it gone from the store, so it was lost while
// held, and its holder learns so as from a refresh.
func (h *hold) report(cause LostCause, err error, atRelease bool) {
	h.mu.Lock()
	if h.lostErr != nil || h.done && !atRelease {
		h.mu.Unlock()
		return
	}
	h.lostErr = err
	if h.lost != nil {
		close(h.lost)
	}
	fns := h.onLost
	h.onLost = nil
	h.mu.Unlock()
	h.c.dog.unschedule(h)
	h.c.cfg.logger.Warn("locker: lock lost", "name", h.name, "token", Token(h.token), "err", err)
	if o := h.c.cfg.obs; o != nil && o.Lost != nil {
		o.Lost(LostEvent{LockRef: h.ref(), Held: time.Since(h.granted), Cause: cause, Err: err})
	}
	for _, f := range fns {
		(*f)(err)
	}
}

// lostChan returns the channel closed at h's loss, made on first use: a
// channel per lock is a cost that most callers never ask for.
func (h *hold) lostChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		if h.lostErr != nil {
			return closedChan
		}
		h.lost = make(chan struct{})
	}
	return h.lost
}

var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// afterLost calls f when the lock is lost (at once if it is already), unless
// stop is called first.
func (h *hold) afterLost(f func(error)) (stop func()) {
	h.mu.Lock()
	if h.lostErr != nil {
		err := h.lostErr
		h.mu.Unlock()
		f(err)
		return func() {}
	}
	p := &f
	h.onLost = append(h.onLost, p)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		h.onLost = slices.DeleteFunc(h.onLost, func(q *func(error)) bool { return q == p })
		h.mu.Unlock()
	}
}

// Past its deadline a lock is lost whether or not the watchdog has run yet
// (on a busy machine its timer fires late): Err never calls a lock held
// when the store may have freed it.
func (h *hold) err() error {
	h.mu.Lock()
	err, done, until, lastErr := h.lostErr, h.done, h.validUntil, h.refreshErr
	h.mu.Unlock()
	if err != nil || done {
		return err
	}
	now := time.Now()
	switch {
	case h.contact != nil:
		if _, gone := h.sessionGone(now); !gone {
			return nil
		}
	case until.IsZero() || now.Before(until):
		return nil
	default:
		h.loseBy(LostExpired, h.ranOut(lastErr))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr
}

// ranOut is the loss of a lock whose deadline passed without a confirmed
// refresh; lastErr is the last failed automatic refresh, or nil.
func (h *hold) ranOut(lastErr error) error {
	why := "its TTL ran out without a confirmed refresh"
	if lastErr != nil {
		why = "refreshes failed until its TTL ran out: " + lastErr.Error()
	}
	return fmt.Errorf("locker: %q: %w: %s", h.name, ErrLost, why)
}

// confirmed records that the store held the lock for a full TTL from start,
// a time taken before the request was sent, so our deadline, a clock
// margin sooner still, is never later than the store's. A session-backed
// lock lives as long as its session instead: see sessionUntil.
func (h *hold) confirmed(start time.Time) {
	h.extend(start)
	h.c.dog.schedule(h, start)
}

// extend moves h's deadline to what the store's confirmation at start
// gives it.
func (h *hold) extend(start time.Time) {
	var until time.Time
	if h.contact != nil {
		until = h.sessionUntil()
	} else {
		until = start.Add(h.ttl - backend.ClockMargin(h.ttl))
	}
	h.mu.Lock()
	if until.After(h.validUntil) {
		h.validUntil = until
	}
	h.mu.Unlock()
}

// sessionGone declares a session-backed hold lost, and reports so, once at
// now its session has ended or may have expired; else it returns until
// when the session holds it.
func (h *hold) sessionGone(now time.Time) (until time.Time, gone bool) {
	until = h.sessionUntil()
	switch {
	case until.IsZero():
		h.loseBy(LostReported, fmt.Errorf("locker: %q: %w: its session ended", h.name, ErrLost))
	case !now.Before(until):
		h.loseBy(LostExpired, fmt.Errorf("locker: %q: %w: no answer from the store for the session timeout (%v): the session may have expired", h.name, ErrLost, h.session))
	default:
		return until, false
	}
	return until, true
}

// sessionUntil is when a session-backed lock may be gone, judged from the
// last request on its session that the store answered; zero when the
// driver knows the session ended.
func (h *hold) sessionUntil() time.Time {
	t := h.contact()
	if t.IsZero() {
		return t
	}
	return t.Add(h.session - backend.ClockMargin(h.session))
}

// Lock is a held lock. Each successful Acquire returns its own Lock; a
// re-entrant one shares the hold of the outer one.
type Lock struct {
	h        *hold
	released atomic.Bool
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.h.name }

// Label returns the label the store records as the lock's holder (see
// WithLabel and Label).
func (l *Lock) Label() string { return l.h.label }

// Token returns the holder's secret token. Printing it shows a prefix only.
func (l *Lock) Token() Token { return Token(l.h.token) }

// Fence returns the fencing token: for one name, strictly greater than the
// fence of every earlier holder, on any client. Pass it to the resource the
// lock protects, which rejects writes with a fence lower than one it has
// seen. Zero means the backend issues no fencing tokens. A re-entrant Lock
// has the fence of its outer one.
func (l *Lock) Fence() uint64 { return l.h.fence }

// TTL returns the effective TTL the backend granted: the requested one or
// more, never less.
func (l *Lock) TTL() time.Duration { return l.h.ttl }

// Lost returns a channel that is closed as soon as the lock is known lost: a
// refresh was rejected, the TTL ran out without a refresh, the backend's
// session or lease ended, or the Client was closed. It is not closed by
// Release.
func (l *Lock) Lost() <-chan struct{} { return l.h.lostChan() }

// Err returns nil while the lock is not known lost, then an error wrapping
// ErrLost (or ErrClosed) that says why.
func (l *Lock) Err() error { return l.h.err() }

// Deadline returns when the store may free the lock at the earliest, judged
// from this side: a clock margin before its TTL (or, for a session-backed
// lock, its session timeout) runs out from the last refresh or session
// contact that the store confirmed. It moves on with each confirmation.
// Once Lost fires, or after Release, it means nothing; the zero time means
// a session-backed lock's session is known to have ended.
func (l *Lock) Deadline() time.Time { return l.h.deadline() }

// Refresh extends the lock to its TTL from now. It returns an error wrapping
// ErrNotHeld when the store shows the lock gone (and Lost fires), one
// wrapping ErrLost as well when the lock's deadline passed before the
// store answered (Lost has fired by then), and the store's error when it
// cannot tell.
//
// Unlike Release, Refresh stops when ctx ends, and with ctx already ended
// it does not ask the store: it returns an error wrapping ctx's cause. A
// refresh matters only to a caller that goes on holding the lock, and one
// left undone changes nothing: the lock keeps its deadline, the watchdog
// its schedule.
func (l *Lock) Refresh(ctx context.Context) error {
	h := l.h
	if l.released.Load() {
		return fmt.Errorf("locker: refresh %q: %w: released", h.name, ErrNotHeld)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("locker: refresh %q: %w", h.name, context.Cause(ctx))
	}
	ctx, end, err := h.c.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("locker: refresh %q: %w", h.name, err)
	}
	defer end()
	if err := h.err(); err != nil {
		return fmt.Errorf("locker: refresh %q: %w: %w", h.name, ErrNotHeld, err)
	}
	// A refresh answered after the deadline comes too late to matter: the
	// lock is declared lost then, whatever the store is doing.
	dctx, cancel := context.WithDeadline(ctx, h.deadline())
	defer cancel()
	err = h.c.refresh(dctx, h)
	if err == nil || ctx.Err() != nil || dctx.Err() == nil {
		return err
	}
	// Cut by the lock's own deadline, which the caller did not set: past
	// it the lock is lost, unless a confirmation meanwhile moved it on.
	// Either way the deadline's error is not the caller's to see.
	if lost := h.err(); lost != nil {
		return fmt.Errorf("locker: refresh %q: %w: %w", h.name, ErrNotHeld, lost)
	}
	return fmt.Errorf("locker: refresh %q: no answer from the store before the lock's deadline, which another refresh has since moved on", h.name)
}

// Release frees the lock, or for a re-entrant Lock one level of it: the
// store frees the lock at the outermost Release. A second Release of the
// same Lock, or a Release after the lock was lost, returns an error wrapping
// ErrNotHeld. A Release that finds the lock gone from the store (expired,
// broken or taken over) reports the loss as a refresh would: Lost fires
// before it returns, and its error wraps ErrLost too. When the store
// cannot be reached, the error says so and the lock expires after its TTL.
//
// Release does not stop when ctx ends, nor at its deadline: `defer
// l.Release(ctx)` in a handler whose request has ended still frees the
// lock, as Do does. It waits for the store for at most the lock's TTL,
// kept between 1 and 10 seconds (past the TTL the store frees the lock
// anyway), and its error wraps ctx's cause only when the store did not
// confirm the release and ctx had ended.
func (l *Lock) Release(ctx context.Context) error {
	h := l.h
	if !l.released.CompareAndSwap(false, true) {
		return fmt.Errorf("locker: release %q: %w: released already", h.name, ErrNotHeld)
	}
	// outlive's context never ends: the gate's own, which Close ends,
	// with ctx's values, and no context of the call's own before the
	// bound's.
	gctx, end, err := h.c.gate.Enter(outlive(ctx))
	if err != nil {
		return fmt.Errorf("locker: release %q: %w", h.name, err)
	}
	defer end()
	rctx, cancel := context.WithTimeout(gctx, releaseTimeout(h.ttl))
	defer cancel()
	err = h.c.release(rctx, h)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrNotHeld) {
		return fmt.Errorf("%w; the caller's context had ended: %w", err, context.Cause(ctx))
	}
	return err
}

// outlive is context.WithoutCancel(ctx), and ctx itself when it can end
// neither way: one allocation less a release on a context.Background().
func outlive(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
