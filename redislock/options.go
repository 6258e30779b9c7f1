package redislock

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Option configures a Driver, a FairDriver or a Quorum. An option given a
// value out of its range makes the constructor (New, NewFair, NewQuorum,
// Open, OpenFair, OpenQuorum) fail before any network call.
type Option func(*config)

type config struct {
	logger      *slog.Logger
	linger      time.Duration
	driftFactor float64
	driftMin    time.Duration
	// restartDelay is WithRestartDelay's cap; < 0: none (the lock's TTL).
	restartDelay time.Duration
	// retention is WithRetention's.
	retention time.Duration
	// err is the first option given a value out of its range.
	err error
}

// buildConfig applies opts to the defaults; the first bad one is an error.
func buildConfig(opts []Option) (config, error) {
	cfg := config{
		logger:       slog.New(slog.DiscardHandler),
		linger:       time.Second,
		driftFactor:  0.01,
		driftMin:     2 * time.Millisecond,
		restartDelay: defaultRestartDelay,
		retention:    DefaultRetention,
	}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg, cfg.err
}

// invalid records an option's bad value, the first only.
func (c *config) invalid(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("redislock: %w: %s", backend.ErrInvalidOption, fmt.Sprintf(format, args...))
	}
}

// defaultRestartDelay is the cap by default: none. A variable for the tests.
var defaultRestartDelay time.Duration = -1

// WithRestartDelay caps how long a server refuses, after it starts, every
// name (URL: restart_delay=; default: the
// lock's TTL, so that holders a restart forgot run out first: see
// docs/backends/redislock.md, What Redis cannot promise). A server
// that persists every write (appendfsync always) forgets nothing: 0 turns
// the check off. A negative d is an error.
func WithRestartDelay(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("WithRestartDelay(%v): negative", d)
			return
		}
		c.restartDelay = d
	}
}

// DefaultRetention is WithRetention's default.
const DefaultRetention = 24 * time.Hour

// WithRetention sets how long a name's fence counter outlives the name's
// last grant (URL: retention=; default DefaultRetention); then the next
// grant seeds it from the server's clock again, so fences keep increasing
// as long as no server's clock steps back by more than d (for a Quorum,
// and the servers' clocks differ by less). d must be positive. See
// docs/backends/redislock.md, Fences and retention.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.invalid("WithRetention(%v): not positive", d)
			return
		}
		c.retention = d
	}
}

// WithLogger sets where the driver reports a server whose maxmemory-policy
// may evict lock keys, and go-redis's own messages while it is open (see
// docs/backends/redislock.md, Logging). Default, and nil: nowhere.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithClockDrift sets the Quorum's allowance for clock-rate differences
// with the servers: factor of the TTL (default 0.01, in [0, 0.5)) plus
// fixed (default 2ms, not negative). A Driver ignores it.
func WithClockDrift(factor float64, fixed time.Duration) Option {
	return func(c *config) {
		if !(factor >= 0 && factor < 0.5) || fixed < 0 {
			c.invalid("WithClockDrift(%v, %v): want a factor in [0, 0.5) and a fixed drift not negative", factor, fixed)
			return
		}
		c.driftFactor, c.driftMin = factor, fixed
	}
}

// withLinger sets how long an idle channel stays subscribed. For tests.
func withLinger(d time.Duration) Option { return func(c *config) { c.linger = d } }
