package locker

import (
	"crypto/rand"
	"io"
	"log/slog"
	"time"
)

// DefaultTTL is the TTL of a lock when neither the Client nor the call sets one.
const DefaultTTL = 30 * time.Second

type config struct {
	namespace  string
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

// WithRandom replaces crypto/rand as the source of owner tokens. For tests.
func WithRandom(r io.Reader) Option { return func(c *config) { c.rand = r } }

type lockConfig struct {
	ttl     time.Duration
	owner   string
	noAuto  bool
	ttlSet  bool
	waitMax time.Duration
	waitSet bool
	minHold time.Duration
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig)

// TTL sets how long the lock lives without a refresh. The backend may round
// it up (Lock.TTL reports what it granted); it never shortens it.
func TTL(ttl time.Duration) LockOption {
	return func(c *lockConfig) { c.ttl, c.ttlSet = ttl, true }
}

// Owner makes the acquisition reentrant for owner within this Client: while
// a lock on the name is held under the same owner, Acquire succeeds at once,
// counts one level deeper and keeps the fence, and only the outermost
// Release frees the lock. Go has no thread identity, so the owner is
// explicit: a request ID, a job name. Without Owner every acquisition is a
// new holder, like sync.Mutex. Two Clients never share a hold, whatever the
// owner: a lock is held by one Client at a time.
func Owner(owner string) LockOption { return func(c *lockConfig) { c.owner = owner } }

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

// AutoRefresh turns the watchdog on (the default) or off. With it, the
// Client refreshes the lock every TTL/3 until Release. Without it, the lock
// expires TTL after it was acquired or last refreshed, and Lost fires then.
// On backends whose locks live in a server-side session (etcd, ZooKeeper:
// backend.Session) the session keeps every lock alive and the option has
// no effect; such a lock is lost when the session ends.
func AutoRefresh(on bool) LockOption { return func(c *lockConfig) { c.noAuto = !on } }
