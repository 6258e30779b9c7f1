package locker

import (
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
)

// DefaultTTL is the TTL of a lock when neither the Client nor the call sets one.
const DefaultTTL = 30 * time.Second

type config struct {
	namespace  string
	label      string
	ttl        time.Duration
	logger     *slog.Logger
	rand       io.Reader
	backoffMin time.Duration
	backoffMax time.Duration
	obs        *Observer
}

func defaultConfig() config {
	return config{
		namespace:  "locker",
		label:      defaultLabel(),
		ttl:        DefaultTTL,
		logger:     slog.New(slog.DiscardHandler),
		rand:       rand.Reader,
		backoffMin: 2 * time.Millisecond,
		backoffMax: 250 * time.Millisecond,
	}
}

// Option configures a Client.
type Option func(*config)

// WithNamespace sets the key prefix of every lock of the Client (default
// "locker"): 1 to 64 bytes of letters, digits, '.', '_' and '-'. Two
// applications with different namespaces never collide on a shared store.
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithLabel sets the label of the Client's locks: what the store records
// as their holder, for operators (State.Owner from Inspect and List,
// lockctl status, the Observer's LockRef.Owner). The default is the host
// name and the process ID, "host:pid", as ShedLock's lockedBy. A label is
// only a description: any number of holders may share one, and sharing it
// never lets one in where another holds the lock (for that, see
// Reentrant). It is valid UTF-8 without NUL, at most MaxLabelLen bytes.
func WithLabel(label string) Option { return func(c *config) { c.label = label } }

// defaultLabel is "host:pid", the host name cut so that it fits MaxLabelLen.
var defaultLabel = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	return strings.ToValidUTF8(host[:min(len(host), MaxLabelLen-len(pid))], "") + pid
})

// WithDefaultTTL sets the TTL of locks acquired without the TTL option.
func WithDefaultTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithLogger sets where the Client reports refresh failures and lost locks
// (default: nowhere). Tokens are logged only as a short prefix.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithBackoff bounds the wait between attempts of a blocking Acquire on
// backends without native queues (default 2ms doubling up to 250ms, with
// jitter). Notifications, where the backend has them, wake waiters sooner.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

type lockConfig struct {
	ttl       time.Duration
	label     string
	reentrant string // the key of Reentrant, or ""
	noAuto    bool
	ttlSet    bool
	waitMax   time.Duration
	waitSet   bool
	minHold   time.Duration
	delay     time.Duration
	mode      backend.Mode
	limit     int
	weight    int // Permits', or 0: one permit
	weightSet bool
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig)

// with returns lc with opts applied. A config that options see is on the
// heap (they are unknown functions): apart, a call without options keeps
// its own on the stack.
func (lc lockConfig) with(opts []LockOption) lockConfig {
	for _, o := range opts {
		o(&lc)
	}
	return lc
}

// TTL sets how long the lock lives without a refresh. The backend may round
// it up (Lock.TTL reports what it granted); it never shortens it.
func TTL(ttl time.Duration) LockOption {
	return func(c *lockConfig) { c.ttl, c.ttlSet = ttl, true }
}

// Label sets the label of this acquisition, in place of the Client's (see
// WithLabel): a job name, a request ID. It describes the holder and
// nothing more: holders that share a label exclude each other as any
// holders do. A re-entry keeps the label of the outermost acquisition.
func Label(label string) LockOption { return func(c *lockConfig) { c.label = label } }

// Reentrant makes the acquisition reentrant for key within this Client:
// while a lock on the name is held under the same key, Acquire succeeds at
// once, counts one level deeper and keeps the fence, and only the
// outermost Release frees the lock. Go has no thread identity, so the key
// is explicit, and only the caller knows which goroutines may share a
// hold: a request ID, a job name, never a host name. Without Reentrant
// every acquisition is a new holder, like sync.Mutex, whatever its label.
// Two Clients never share a hold, whatever the key: a lock is held by one
// Client at a time.
func Reentrant(key string) LockOption { return func(c *lockConfig) { c.reentrant = key } }

// Owner is Reentrant(owner) and Label(owner) together.
//
// Deprecated: Owner made labelling a holder and letting it re-enter one
// thing, so that a label shared by goroutines (a host name) let them all
// in at once. Use Label to describe the holder, and Reentrant, alone, for
// reentrancy.
func Owner(owner string) LockOption {
	return func(c *lockConfig) { c.label, c.reentrant = owner, owner }
}

// WaitAtMost bounds how long Acquire or Do waits for the lock, apart from
// the caller's context: when d runs out first, the call returns an error
// wrapping ErrNotAcquired, and Do does not run fn. Only the wait is
// bounded: once acquired, the lock and Do's fn run under the caller's
// context alone (and the loss). d <= 0 tries once, as TryAcquire and TryDo
// do. TryAcquire ignores it.
func WaitAtMost(d time.Duration) LockOption {
	return func(c *lockConfig) { c.waitMax, c.waitSet = d, true }
}

// MinHold keeps the lock held for at least d from its acquisition, however
// soon it is released: a Release before then leaves it in the store,
// unrefreshed, until d has passed, and the store frees it then. That is
// ShedLock's lockAtLeastFor: a job that several hosts start on a schedule,
// each with TryDo, runs once even when it finishes before the slowest
// host's clock reaches the schedule. The Lock is done at Release (no
// refresh, no lost signal after it). Where locks live for a TTL, the
// remainder is one refresh with that TTL, so it outlives the process. On
// etcd the entry moves to a lease of its own (backend.Lingerer). On
// ZooKeeper, whose nodes live only as long as their session, the Client
// releases the lock when d has passed: a Close or the process's end before
// then frees it early, at the session's end. d <= 0 turns it off.
func MinHold(d time.Duration) LockOption { return func(c *lockConfig) { c.minHold = d } }

// LockDelay keeps the name from being granted to anyone for d after the
// lock is lost without a release (Chubby's and Consul's lock-delay): its
// holder crashed, was cut off or paused past the TTL, and may still be
// writing, so a resource that cannot check fences gets d of quiet before
// the next holder. A Release frees the name at once, as always. The lock
// lives TTL+d in the store while the Client treats it as lost after TTL
// (Lost fires then, as without the option); Inspect shows the lost
// holder's lock until it expires, and ForceRelease ends the delay. It
// costs no request. Where locks live in a session, d counts from the
// session's end, on drivers that keep a marker past it (backend.Delayer:
// etcd, whose marker is a lease per session and delay); the others return
// ErrUnsupported before any network call. d <= 0 turns it off.
func LockDelay(d time.Duration) LockOption { return func(c *lockConfig) { c.delay = d } }

// AutoRefresh turns the watchdog on (the default) or off. With it, the
// Client refreshes the lock every TTL/3 until Release. Without it, the lock
// expires TTL after it was acquired or last refreshed, and Lost fires then.
// On backends whose locks live in a server-side session (etcd, ZooKeeper:
// backend.Session) the session keeps every lock alive and the option has
// no effect; such a lock is lost when the session ends.
func AutoRefresh(on bool) LockOption { return func(c *lockConfig) { c.noAuto = !on } }

// Semaphore makes the acquisition take one of limit permits of the
// semaphore called name, rather than the lock: at most limit holders at
// once, across every Client of the store. A permit is a Lock like any
// other (TTL, watchdog, Lost, fence, Release, Do), and its fence increases
// with every grant of the semaphore. A semaphore, a lock and a read-write
// lock of one name are three separate things. All holders must agree on
// limit: a claim with another limit than the held permits' fails with
// ErrLimitMismatch; once every permit is free, the next claim's limit
// holds. A limit set by Client.Resize overrides limit while it stands.
// limit is 1 to MaxLimit (ErrInvalidLimit otherwise). With
// Reentrant, one key holds one claim (one permit, or Permits), re-entrantly. A backend without semaphores
// returns ErrUnsupported before any network call.
func Semaphore(limit int) LockOption {
	return func(c *lockConfig) { c.mode, c.limit = backend.Permit, limit }
}

// Permits makes a Semaphore acquisition take n of its permits at once, as
// one Lock (one fence, one TTL, one Release): all n or none. It is
// granted while the permits held plus n are at most the limit; where the
// backend queues waiters (backend.Queuer), a claim of many is served in
// its turn, not overtaken by lighter ones behind it. n is 1 (the default)
// to the limit; out of range, or without Semaphore, it is
// ErrInvalidLimit. A re-entry under a Reentrant key must ask for the
// same n (ErrLimitMismatch otherwise). A backend that counts grants
// rather than permits (not a backend.Weigher) returns ErrUnsupported for
// n above 1, before any network call.
func Permits(n int) LockOption {
	return func(c *lockConfig) { c.weight, c.weightSet = n, true }
}

// Read makes the acquisition take the read side of the read-write lock
// called name: any number of readers at once, but never with a writer.
// Writers come first: once a writer waits, new readers wait behind it
// (on backends with a native queue, readers and writers are served in
// arrival order), so readers cannot starve writers. With Reentrant, a key
// that reads may read again (re-entry), but asking to write while it
// reads, or to read while it writes, fails at once with ErrModeConflict:
// there is no upgrade or downgrade. A backend without read-write locks
// returns ErrUnsupported before any network call.
func Read() LockOption { return func(c *lockConfig) { c.mode, c.limit = backend.Read, 0 } }

// Write makes the acquisition take the write side of the read-write lock
// called name: one writer, and no reader. Its fence is above that of every
// reader and writer granted before it. See Read.
func Write() LockOption { return func(c *lockConfig) { c.mode, c.limit = backend.Write, 0 } }
