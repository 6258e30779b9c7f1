package locker

import (
	"context"
	"errors"
	"time"
)

// Observer receives the Client's events, for metrics, traces and logs, as
// net/http/httptrace.ClientTrace does an HTTP request's. Every hook is
// optional, and one that is not set costs a nil check. Hooks run
// synchronously on the goroutine where the event happens (the caller's, or
// the watchdog's): they must be quick, must not block and must not call
// the Client. A Client has one Observer (WithObserver); to feed several,
// set hooks that call each.
type Observer struct {
	// AcquireStart: an Acquire or TryAcquire passed its input checks and
	// is about to ask the store (or this Client, for a re-entry).
	// ctx is the caller's. The context it returns (nil for ctx) is passed
	// to AcquireDone, and nowhere else: a tracer starts a span in it.
	AcquireStart func(ctx context.Context, e AcquireStartEvent) context.Context
	// AcquireDone: it ended, granted or not. Contention shows as a refused
	// TryAcquire, and as an Acquire that waited.
	AcquireDone func(ctx context.Context, e AcquireDoneEvent)
	// DoStart: Do begins. The context it returns (nil for ctx) is the
	// parent of Do's acquisition and of the context fn runs with, so that
	// fn's own spans nest under Do's.
	DoStart func(ctx context.Context, e DoStartEvent) context.Context
	// DoDone: Do returns, with its error.
	DoDone func(ctx context.Context, e DoDoneEvent)
	// Refreshed: a refresh of a held lock returned: the watchdog's,
	// Lock.Refresh or a re-entry's.
	Refreshed func(RefreshEvent)
	// Lost: a held lock was found lost (or Close ended it). It runs just
	// after the Lock's Lost channel closes.
	Lost func(LostEvent)
	// Released: the release of a lock in the store returned (inner
	// re-entrant levels are not store releases).
	Released func(ReleaseEvent)
	// StoreError: a call to the store failed with an error that is not an
	// answer (ErrNotAcquired, ErrNotHeld), whether the Client retries it or
	// returns it.
	StoreError func(StoreErrorEvent)
}

// LockRef names the lock of an event.
type LockRef struct {
	Namespace string
	Name      string
	Owner     string // the holder's label (see WithLabel and Label)
	Fence     uint64 // zero before the grant, or when the backend issues none
	// Mode is "exclusive", "read", "write" (Read, Write) or "permit"
	// (Semaphore), and Limit the semaphore's limit (0 for other modes):
	// a name's locks, readers and permits are told apart by it.
	Mode  string
	Limit int
}

// AcquireStartEvent is Observer.AcquireStart's.
type AcquireStartEvent struct {
	LockRef
	Wait bool // Acquire (waits) rather than TryAcquire
}

// Wake says what prompted the try that took a lock.
type Wake uint8

const (
	WakeFirst    Wake = iota // the first try: no wait
	WakeNotified             // the store's release notification
	WakeLocal                // a release by this Client
	WakeTimer                // the backoff timer: polling
	WakeQueue                // the driver's native queue granted it
	WakeReentry              // a Reentrant key's re-entry: no store acquisition
)

var wakeNames = [...]string{"first", "notified", "local", "timer", "queue", "reentry"}

func (w Wake) String() string {
	if int(w) < len(wakeNames) {
		return wakeNames[w]
	}
	return "unknown"
}

// AcquireDoneEvent is Observer.AcquireDone's.
type AcquireDoneEvent struct {
	LockRef
	Wait      bool
	Waited    time.Duration // from AcquireStart to the answer
	Attempts  int           // requests that asked the store for the lock; 1 for a native queue
	Contended bool          // the first try found the lock held by another
	Woken     Wake          // for a grant: what prompted the try that took it
	// Err is nil for a grant; it wraps ErrNotAcquired for a refusal or a
	// wait that ended (the context, Close), and is the store's or an
	// input's error otherwise.
	Err error
}

// RefreshEvent is Observer.Refreshed's.
type RefreshEvent struct {
	LockRef
	Auto bool          // the watchdog's, rather than Lock.Refresh or a re-entry's
	Took time.Duration // the store's answer took this long
	// Err is nil when the store extended the lock; it wraps ErrNotHeld
	// when the store proved the lock gone (Lost follows), and is the
	// store's error when it could not tell (the watchdog retries).
	Err error
}

// DoStartEvent is Observer.DoStart's.
type DoStartEvent struct {
	LockRef
}

// DoDoneEvent is Observer.DoDone's.
type DoDoneEvent struct {
	LockRef
	Held time.Duration // from the grant to the release; zero if not acquired
	Err  error         // as Do returns
}

// LostCause says how a lock was lost.
type LostCause uint8

const (
	// LostGone: the store showed the lock gone or another's (a refresh,
	// or the holder's release, found it so): it expired there, or was
	// taken over or deleted.
	LostGone LostCause = iota
	// LostExpired: its TTL or session timeout ran out, judged from this
	// side, before a refresh or the session was confirmed.
	LostExpired
	// LostReported: the driver reported it: the session expired, the
	// lock's node or key was deleted.
	LostReported
	// LostClosed: Client.Close ended it.
	LostClosed
)

var lostNames = [...]string{"gone", "expired", "reported", "closed"}

func (c LostCause) String() string {
	if int(c) < len(lostNames) {
		return lostNames[c]
	}
	return "unknown"
}

// LostEvent is Observer.Lost's.
type LostEvent struct {
	LockRef
	Held  time.Duration // from the grant to the loss
	Cause LostCause
	Err   error // wraps ErrLost, or ErrClosed when Close ended the lock
}

// ReleaseEvent is Observer.Released's.
type ReleaseEvent struct {
	LockRef
	Held time.Duration // from the grant to the release
	// Err is what Lock.Release returns: nil, or wrapping ErrNotHeld (and
	// ErrLost when Lost was reported before), or the store's error.
	Err error
}

// StoreErrorEvent is Observer.StoreError's.
type StoreErrorEvent struct {
	LockRef
	Op       string // "acquire", "subscribe", "refresh" or "release"
	Retrying bool   // the Client tries again (a waiting Acquire, the watchdog)
	Err      error
}

// WithObserver sets the Client's Observer (default none).
func WithObserver(o *Observer) Option { return func(c *config) { c.obs = o } }

// ref is h's LockRef.
func (h *hold) ref() LockRef {
	return LockRef{Namespace: h.c.cfg.namespace, Name: h.name, Owner: h.label, Fence: h.fence, Mode: h.mode.String(), Limit: h.limit}
}

// storeError reports a store failure of op on h, if anyone listens.
func (c *Client) storeError(h *hold, op string, retrying bool, err error) {
	if o := c.cfg.obs; o != nil && o.StoreError != nil && isStoreError(err) {
		o.StoreError(StoreErrorEvent{LockRef: h.ref(), Op: op, Retrying: retrying, Err: err})
	}
}

// refreshed reports a refresh of h sent at start, if anyone listens.
func (c *Client) refreshed(h *hold, auto bool, start time.Time, err error) {
	o := c.cfg.obs
	if o == nil {
		return
	}
	if o.Refreshed != nil {
		o.Refreshed(RefreshEvent{LockRef: h.ref(), Auto: auto, Took: time.Since(start), Err: err})
	}
	c.storeError(h, "refresh", auto, err)
}

// isStoreError tells a failure to reach or use the store from an answer
// (not acquired, not held) and from the caller's or Client's own end.
func isStoreError(err error) bool {
	return err != nil && !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrNotHeld) &&
		!errors.Is(err, ErrClosed) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// tries counts an acquisition's requests, for AcquireDone.
type tries struct {
	h         *hold
	attempts  int
	contended bool
	woken     Wake
}

// tried records a try's outcome; the first refused one means contention.
func (t *tries) tried(err error) {
	t.attempts++
	if t.attempts == 1 && errors.Is(err, ErrNotAcquired) {
		t.contended = true
	}
}
