package redislock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Driver is the Redis backend for one deployment: a server, a Redis
// Cluster or a ring, through any go-redis client. It implements
// backend.Driver, backend.Queuer and backend.Notifier.
type Driver struct {
	dep  *deployment
	fair bool         // a FairDriver's: acquire and release mind the queue
	gate backend.Gate // calls in flight, ended and awaited by Close
	// tries counts the scripts that queued acquisitions sent that could
	// grant them (measure.StoreTries); a hand-off's message costs none.
	tries atomic.Uint64
}

// The optional interfaces, each implemented in a file of its own.
var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.Notifier       = (*Driver)(nil)
	_ backend.Queuer         = (*Driver)(nil)
	_ backend.Modal          = (*Driver)(nil)
	_ backend.Resizer        = (*Driver)(nil)
	_ backend.SetAcquirer    = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.Inspector      = (*Driver)(nil)
	_ backend.Lister         = (*Driver)(nil)
	_ backend.Breaker        = (*Driver)(nil)
	_ backend.Diagnoser      = (*Driver)(nil)
	_ backend.StoreClock     = (*Driver)(nil)
)

// New returns a Driver on a client the caller has (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or failover client), which Close does
// not close. It warns (WithLogger), from the background, of a
// maxmemory-policy other than noeviction, and fails before any network
// call when rdb is nil or an option is out of its range.
func New(rdb redis.UniversalClient, opts ...Option) (*Driver, error) {
	return newDriver(rdb, false, opts)
}

// newDriver is New, and NewFair's when fair.
func newDriver(rdb redis.UniversalClient, fair bool, opts []Option) (*Driver, error) {
	if rdb == nil {
		return nil, fmt.Errorf("redislock: New: %w: nil client", backend.ErrInvalidOption)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	d := &Driver{dep: newDeployment(rdb, nil, &cfg), fair: fair}
	d.dep.checkMaxmemoryAsync("redis")
	return d, nil
}

// Client returns the go-redis client the Driver uses.
func (d *Driver) Client() redis.UniversalClient { return d.dep.rdb }

// TryAcquire implements backend.Driver: one script sets the lock key and
// advances the name's fence counter.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", err)
	}
	defer done()
	if ctx.Err() != nil {
		// Nothing sent, nothing to clean up.
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", context.Cause(ctx))
	}
	px := ttlMillis(l.TTL)
	n := attempts.Add(1)
	var value string
	var r int64
	switch {
	case l.Mode != backend.Exclusive:
		// Granted only as if it had joined the end of the queue.
		if err := checkShared(l); err != nil {
			return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", err)
		}
		var a sharedAnswer
		if a, err = d.dep.acquireShared(ctx, l, n, px, "", "try"); err == nil && a.limit != "" {
			return backend.Grant{}, limitMismatch("try-acquire", a, l)
		}
		r = a.v
	case d.fair:
		// Not while a live waiter is queued.
		value = attemptValue(l.Token, n)
		r, err = d.dep.queueAcquire(ctx, true, l, value, px, "", "try")
	default:
		value = attemptValue(l.Token, n)
		r, err = d.acquire(ctx, l, value, px)
	}
	if err != nil {
		// The script may have run although we never saw its answer.
		d.dep.undo(ctx, func(ctx context.Context) {
			switch {
			case l.Mode != backend.Exclusive:
				d.dep.cleanupShared(ctx, l, n)
			case d.fair:
				d.dep.cleanup(ctx, l, value)
			default:
				d.dep.handoffCleanup(ctx, l, value)
			}
		})
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", err)
	}
	if r <= 0 {
		return backend.Grant{}, notAcquired("try-acquire", r)
	}
	return backend.Grant{Fence: uint64(r), TTL: time.Duration(px) * time.Millisecond}, nil
}

// Refresh implements backend.Driver: RefreshMany's batch of one.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	return d.RefreshMany(ctx, []backend.Claim{l})[0]
}

// Release implements backend.Driver. A lock with live waiters goes to the
// first (queue.go, handoffRelease); otherwise the release wakes the key's waiters.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	defer done()
	release := d.dep.handoffRelease
	switch {
	case l.Mode != backend.Exclusive:
		release = d.dep.releaseShared
	case d.fair:
		release = d.dep.fairRelease
	}
	return heldErr(release(ctx, l))
}

// heldErr is the error of a refresh or a release that answered ok, or err.
func heldErr(ok bool, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("redislock: %w", err)
	case !ok:
		return fmt.Errorf("redislock: %w", backend.ErrNotHeld)
	}
	return nil
}

// Close implements backend.Driver: it ends the calls in flight and waits
// for them, stops the goroutines, and closes the client if Open made it.
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("redislock: close: %w", backend.ErrClosed)
	}
	return d.dep.close()
}

// acquire runs the plain acquire script (see deployment.acquire).
func (d *Driver) acquire(ctx context.Context, l backend.Claim, value string, px int64) (int64, error) {
	return d.dep.acquire(ctx, d.gate.Background, l, value, px)
}

// FairDriver is a Driver whose waiters are served in arrival order: a free
// lock goes to the longest-waiting live waiter only (backend.Queuer).
// Every client of a name must use the same mode: a plain Driver's
// TryAcquire does not look at the queue.
//
// Fairness costs throughput under contention (the lock is idle until the
// head of the queue tries again) and a key per waiter; a lost release
// message delays the head by up to a third of livenessTTL.
type FairDriver struct {
	*Driver
}

// livenessTTL is how long a waiter that stopped renewing keeps its place
// (a waiter renews it at least every livenessTTL/3): a dead waiter holds
// the queue up for at most this long.
const livenessTTL = 2 * time.Second

// NewFair returns a FairDriver that uses rdb, as New does.
func NewFair(rdb redis.UniversalClient, opts ...Option) (*FairDriver, error) {
	d, err := newDriver(rdb, true, opts)
	if err != nil {
		return nil, err
	}
	return &FairDriver{d}, nil
}
