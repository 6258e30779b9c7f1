package backend

import (
	"context"
	"time"
)

// MaxKeyLen is the longest key, in bytes, that a driver must accept. Keys are
// a namespace (at most MaxNamespaceLen bytes), a '/', and a name (at most
// MaxNameLen bytes); see [Key].
const (
	MaxNameLen      = 256
	MaxNamespaceLen = 64
	MaxKeyLen       = MaxNamespaceLen + 1 + MaxNameLen
)

// Key is how the locker package turns a client namespace and a lock name
// into the key it hands to a driver. Namespaces cannot contain '/', so two
// different (namespace, name) pairs never produce the same key.
func Key(namespace, name string) string { return namespace + "/" + name }

// Claim is one holder's claim on a key, as the locker package hands it to
// a driver: an acquisition asks for it, and Refresh and Release present it
// again, with the Fence the acquisition returned.
type Claim struct {
	// Key identifies the lock in the store (see [Key]). Every valid key must
	// work: the driver escapes or hashes it as its store requires.
	Key string
	// Token is the holder's secret: 32 lowercase hex digits (128 bits from
	// crypto/rand). Only the holder knows it, so a store operation that checks
	// it cannot touch another holder's lock. Drivers must never log it whole.
	Token string
	// TTL is how long the lock lives without a refresh. Always positive.
	TTL time.Duration
	// Fence is the fencing token the driver returned from the acquisition.
	// Zero on acquire; set on Refresh and Release, where a driver may use it
	// to check the exact incarnation (etcd: the create revision).
	Fence uint64
	// Owner is the holder's label (locker.WithLabel, locker.Label: by
	// default "host:pid"), at most 64 bytes of UTF-8 without NUL, or "".
	// A driver stores it so that operators can see who holds a lock
	// (State.Owner). It describes the holder and never identifies it:
	// many holders share a label, and a claim carrying the holder's label
	// is refused like any other (the conformance case SharedLabelExcludes);
	// only Token identifies a holder. Refresh and Release carry the Owner
	// the lock was acquired with, so a driver may treat a stored owner
	// that changed as a theft (sqllock does).
	Owner string
	// OnLost, set on acquire, may be called by a driver at most once, from
	// any goroutine and without blocking, when it learns that this grant is
	// lost (session expired, lease revoked, key deleted under a watch). The
	// locker package also finds losses itself through Refresh, so a driver
	// without such knowledge ignores it.
	OnLost func(error)
	// Mode is what the claim asks for on Key: the lock (Exclusive, the
	// zero value), a semaphore's permit or a read-write lock's side. Only
	// a Modal driver gets claims in other modes (see [Modal]).
	Mode Mode
	// Limit is the semaphore's number of permits, 1 to MaxLimit, for a
	// Permit claim; zero otherwise.
	Limit int
	// Delay is locker.LockDelay's, on an acquisition from a [Delayer]:
	// zero otherwise. Other drivers keep a delayed lock for TTL plus the
	// delay instead, which their claims' TTL already counts.
	Delay time.Duration
	// Weight is how many of the Limit permits a Permit claim takes, 1 to
	// Limit, as one grant (see [Modal]); zero for other modes, and a
	// driver counts a Permit claim's zero (a caller that predates
	// weights) as 1. The locker package sets it above 1 only where the
	// driver is a [Weigher].
	Weight int
}

// Grant is what a driver reports about a successful acquisition.
type Grant struct {
	// Fence is the fencing token: for one key, strictly greater than that of
	// every earlier grant by any client of the store. Zero means the driver
	// issues no fencing tokens.
	Fence uint64
	// TTL is the effective TTL: the requested one, or what the store made of
	// it (rounded up to its granularity or raised to its minimum). Never less
	// than the requested TTL, and never "no expiry".
	TTL time.Duration
	// Sent is when the request that took the lock was sent. A Ticket whose
	// locks live for TTL from that request must set it, since its Wait may
	// block far longer than the TTL first; zero means when the call began,
	// which is right for TryAcquire unless the driver queues requests in
	// the process before sending them (SQLite's write gate), which may set
	// it later than the call began: the lock's TTL counts from then.
	Sent time.Time
	// Contact is set by drivers whose lock lives in a server-side session
	// (see [Session]); nil for locks that live for TTL from each refresh.
	// It returns when the driver sent the latest request on this lock's
	// session that the server answered: a keepalive, a ping or any call.
	// The server counts the session's timeout from no earlier than that,
	// so the lock lives at least until Contact() + SessionTTL. Only answered
	// requests count: a watch event or other bytes the server sends
	// unasked prove nothing about when it last heard from the client. It
	// returns the zero time once the driver knows the session has ended.
	// It is called from any goroutine, often, and must not block.
	Contact func() time.Time
	// SessionTTL, with Contact, is the session's timeout: how long the
	// server keeps the lock after its last contact. It may be shorter than
	// TTL (a ZooKeeper session of 10 s holds a lock asked for 30 s as long
	// as the session lives). Zero means TTL.
	SessionTTL time.Duration
}

// ClockMargin is how much sooner than the store the client gives a lock up:
// a hundredth of its TTL plus 2 ms, for the store's clock running up to 1%
// faster than the client's and for timer slack. A lock confirmed by a
// request sent at t is known lost at t + TTL - ClockMargin(TTL), the
// moment after which the store may free it.
func ClockMargin(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// CancelGrace is how long a driver may spend, after its caller's context
// ended, cleaning up what the call left in the store (a queue entry, an
// ambiguous write) before it returns; what is not done by then it finishes
// in the background. So a cancelled call returns within CancelGrace.
const CancelGrace = 200 * time.Millisecond

// Driver is the required interface. Its methods are called concurrently.
//
// Every method that takes a context returns within one store round trip
// (and at most CancelGrace) after ctx is done (cancelled or past its
// deadline), even when the connection is dead: no store call outlives its ctx's deadline, whatever
// the client library's own timeouts. The locker package bounds a lock's
// validity by its own clock and gives up on a call that does not return in
// time, but a call that outlives its context still holds a connection and
// a goroutine, and a late grant keeps a key held that nobody owns.
type Driver interface {
	// TryAcquire takes c.Key for c.Token with c.TTL, once, without waiting.
	// It returns ErrNotAcquired (possibly wrapped) when another token holds
	// the key, and any other error when it cannot tell (network, server).
	// A lock whose TTL has run out counts as free. On an error, the driver
	// leaves nothing behind that could keep the key held, by the time it
	// returns: a call whose ctx ended undoes what it may have written
	// (within CancelGrace), and a request it stopped waiting for must not
	// be applied after that undo (the conformance case
	// CancelledAcquireLeavesNameFree checks it). An undo of a request whose
	// fate is unknown may free c.Token's lock whatever its fence, even
	// late: the locker package's waits never call TryAcquire (nor
	// TryAcquireAll) with a token again after such an error. A refusal
	// (ErrNotAcquired) is tried again under its token: what the call wrote
	// before it refused is taken back before it returns.
	TryAcquire(ctx context.Context, c Claim) (Grant, error)

	// Refresh extends the lock to c.TTL from now if, and only if, c.Token
	// still holds c.Key. It returns ErrNotHeld when the store shows the key
	// free or held by another token: the lock is proven lost. Any other
	// error means "could not tell".
	Refresh(ctx context.Context, c Claim) error

	// Release frees c.Key if, and only if, c.Token holds it. It returns
	// ErrNotHeld when the token did not hold it, and must never free or
	// shorten another token's lock.
	Release(ctx context.Context, c Claim) error

	// Close releases the driver's resources (connections it opened, not a
	// client the user passed in) and stops its goroutines, including those
	// of the client libraries it created: none is left when it returns.
	// It returns within 2 seconds, connection dead or alive, and calls in
	// flight then return. Later calls return ErrClosed.
	Close() error
}

// Notifier is implemented by drivers that can tell waiters that a key may
// have become free (Redis pub/sub, PostgreSQL LISTEN/NOTIFY). The locker
// package still backs off with a cap, so a lost notification costs latency,
// not liveness.
type Notifier interface {
	// Subscribe starts delivering a value on the returned channel (buffered;
	// sends never block, extra ones are dropped) whenever key may have been
	// released, until cancel is called. After Subscribe returns, no release
	// is missed. cancel is idempotent and must free every resource.
	Subscribe(ctx context.Context, key string) (ch <-chan struct{}, cancel func(), err error)
}

// Notify sends on ch without blocking, as a Notifier's channel wants: one
// value pending is enough.
func Notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Session is implemented by drivers whose locks are kept alive by a
// server-side session that the driver maintains itself (an etcd lease, a
// ZooKeeper session). The locker package then schedules no per-lock
// refresh. It declares a lock lost when Grant.Contact() + SessionTTL -
// ClockMargin(SessionTTL) has passed, whatever the driver is doing; the driver
// reports losses it learns of sooner (an expired session, a deleted node)
// through Claim.OnLost.
type Session interface {
	// SessionTTL is the effective session timeout: how long locks outlive
	// the client's last contact with the store.
	SessionTTL() time.Duration
}

// Delayer is implemented by Session drivers that can keep a name from
// every claim for Claim.Delay after its lock ended without a Release (its
// session expired, its holder was broken), as locker.LockDelay asks: a
// session's end takes its locks with it, so the driver leaves beside the
// lock a marker that outlives the session by the delay, and that Release
// removes with the lock. A claim finds the name held while the marker
// lives, and a waiter waits for it as for a holder.
type Delayer interface {
	Session
	// KeepsDelay reports whether this driver, on its store, keeps delays:
	// false when the store lacks what the marker needs.
	KeepsDelay() bool
}

// BatchRefresher is implemented by drivers that can refresh many locks in
// one round trip (a pipeline, one statement). The watchdog then refreshes
// the locks that fall due together in batches, so that holding many locks
// costs round trips in proportion to batches, not locks.
type BatchRefresher interface {
	// RefreshMany refreshes each claim as Refresh would and returns one
	// error per claim, in order: nil, ErrNotHeld, or another error.
	RefreshMany(ctx context.Context, claims []Claim) []error
}

// SetAcquirer is implemented by drivers that can take several keys in
// one request, all or nothing, and free them in one (a script, a
// transaction): the locker package then takes a lock set whose names are
// free in one round trip, and releases it in one. The claims are
// Exclusive, with distinct keys in byte order.
type SetAcquirer interface {
	// TryAcquireAll takes every claim or none, each as TryAcquire would:
	// one Grant per claim, in order, when it took them all; ErrNotAcquired
	// (possibly wrapped) when any key is held, having taken none; any
	// other error when it cannot tell, having left nothing behind that
	// could keep a key held, as TryAcquire.
	TryAcquireAll(ctx context.Context, claims []Claim) ([]Grant, error)
	// ReleaseAll releases each claim as Release would and returns one
	// error per claim, in order.
	ReleaseAll(ctx context.Context, claims []Claim) []error
}

// Lingerer is implemented by Session drivers that can keep a held lock in
// the store apart from their session (an etcd lease of its own), for the
// locker package's MinHold.
type Lingerer interface {
	// Linger keeps c.Key held by c.Token, unrefreshed and whatever becomes
	// of this driver or its session, for at least c.TTL from now; the
	// store frees it then. The driver reports no loss for c afterwards.
	// It returns ErrNotHeld when c.Token no longer holds c.Key.
	Linger(ctx context.Context, c Claim) error
}
