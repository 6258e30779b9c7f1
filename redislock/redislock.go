package redislock

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Option configures a Driver or a Quorum.
type Option func(*config)

type config struct {
	logger      *slog.Logger
	linger      time.Duration
	driftFactor float64
	driftMin    time.Duration
	// restartDelay caps how long a server that started recently refuses
	// names it has no fence counter for; < 0: no cap (the lock's TTL).
	restartDelay time.Duration
}

func defaultConfig() config {
	return config{
		logger:       slog.New(slog.DiscardHandler),
		linger:       time.Second,
		driftFactor:  0.01,
		driftMin:     2 * time.Millisecond,
		restartDelay: defaultRestartDelay,
	}
}

// defaultRestartDelay is the restart delay's cap when no option or URL
// sets one: none (the lock's TTL). A variable for the tests.
var defaultRestartDelay time.Duration = -1

// WithRestartDelay caps how long a server refuses to grant names it has no
// fence counter for after it starts (URL: restart_delay=). By default it
// refuses for the lock's TTL: a server restarted without persistence has
// forgotten every lock while their holders still run, each until its TTL
// runs out, so granting sooner could make two holders (Redlock's "delayed
// restart", enforced by the server's own uptime). A name's first use on a
// new server waits the same way. A server that persists every write
// (appendonly yes, appendfsync always) forgets nothing: 0 turns the check
// off. Negative values are ignored.
func WithRestartDelay(d time.Duration) Option {
	return func(c *config) {
		if d >= 0 {
			c.restartDelay = d
		}
	}
}

// WithLogger sets where the driver reports a server whose maxmemory-policy
// may evict lock keys (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithClockDrift sets the Quorum's allowance for clock-rate differences
// between this process and the servers: factor of the TTL (default 0.01)
// plus fixed (default 2ms). It has no effect on a Driver.
func WithClockDrift(factor float64, fixed time.Duration) Option {
	return func(c *config) {
		if factor >= 0 && factor < 0.5 {
			c.driftFactor = factor
		}
		if fixed >= 0 {
			c.driftMin = fixed
		}
	}
}

// withLinger sets how long a release channel stays subscribed after its
// last waiter left. For tests.
func withLinger(d time.Duration) Option { return func(c *config) { c.linger = d } }

// Driver is the Redis backend for one deployment: a server, a Redis
// Cluster or a ring, through any go-redis client. It implements
// backend.Driver and backend.Notifier.
type Driver struct {
	n      *node
	fair   bool // a FairDriver's: acquire and release mind the queue
	closed atomic.Bool
}

var (
	_ backend.Driver   = (*Driver)(nil)
	_ backend.Notifier = (*Driver)(nil)
)

// New returns a Driver that uses a client the caller already has: a
// *redis.Client, *redis.ClusterClient, *redis.Ring or failover client.
// Close does not close rdb. New checks the server's maxmemory-policy in the
// background and warns (see WithLogger) when it is not noeviction.
func New(rdb redis.UniversalClient, opts ...Option) *Driver {
	cfg := buildConfig(opts)
	d := &Driver{n: newNode(rdb, false, &cfg)}
	d.n.checkMaxmemoryAsync("redis")
	return d
}

func buildConfig(opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// Client returns the go-redis client the Driver uses.
func (d *Driver) Client() redis.UniversalClient { return d.n.rdb }

// TryAcquire implements backend.Driver: one atomic script sets the lock key
// (SET NX PX) and advances the name's fence counter.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if d.closed.Load() {
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", backend.ErrClosed)
	}
	if ctx.Err() != nil {
		// Nothing sent, nothing to clean up.
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", context.Cause(ctx))
	}
	px := ttlMillis(l.TTL)
	value := attempt(l)
	var r int64
	var err error
	if d.fair {
		// Not while a live waiter is queued.
		r, err = d.n.fairAcquire(ctx, l, value, px, "", false)
	} else {
		r, err = d.n.acquire(ctx, l, value, px)
	}
	if err != nil {
		// The script may have run although we never saw its answer.
		d.n.undo(ctx, func(ctx context.Context) { d.n.cleanup(ctx, l, value) })
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", err)
	}
	if r <= 0 {
		return backend.Grant{}, notAcquired("try-acquire", r)
	}
	return backend.Grant{Fence: uint64(r), TTL: time.Duration(px) * time.Millisecond}, nil
}

// Refresh implements backend.Driver.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	if d.closed.Load() {
		return fmt.Errorf("redislock: refresh: %w", backend.ErrClosed)
	}
	ok, err := d.n.refresh(ctx, l, ttlMillis(l.TTL))
	if err != nil {
		return fmt.Errorf("redislock: refresh: %w", err)
	}
	if !ok {
		return fmt.Errorf("redislock: refresh: %w", backend.ErrNotHeld)
	}
	return nil
}

// Release implements backend.Driver; a release publishes on the key's
// channel so that waiters retry at once.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	if d.closed.Load() {
		return fmt.Errorf("redislock: release: %w", backend.ErrClosed)
	}
	release := d.n.release
	if d.fair {
		release = d.n.fairRelease
	}
	ok, err := release(ctx, l)
	if err != nil {
		return fmt.Errorf("redislock: release: %w", err)
	}
	if !ok {
		return fmt.Errorf("redislock: release: %w", backend.ErrNotHeld)
	}
	return nil
}

// Subscribe implements backend.Notifier over Redis pub/sub.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if d.closed.Load() {
		return nil, nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	ch := make(chan struct{}, 1)
	cancel, err := d.n.subscribe(ctx, key, ch)
	if err != nil {
		return nil, nil, err
	}
	return ch, cancel, nil
}

// Close implements backend.Driver. It stops the Driver's subscriptions and
// goroutines, and closes the client only if Open created it.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return fmt.Errorf("redislock: close: %w", backend.ErrClosed)
	}
	return d.n.close()
}
