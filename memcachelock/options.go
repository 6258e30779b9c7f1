package memcachelock

import (
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

// config is what the options set.
type config struct {
	// restartDelay caps how long a server that started recently refuses
	// names it has no fence counter for (restart.go); < 0: the lock's TTL.
	restartDelay time.Duration
	// retention is how long a fence counter lives after its seed.
	retention time.Duration
	// timeout and maxIdle configure the client Open makes; 0: unset.
	timeout time.Duration
	maxIdle int
	err     error
}

// Option configures a Driver made with New or Open.
type Option func(*config)

func newConfig(opts []Option) (config, error) {
	cfg := config{restartDelay: -1, retention: DefaultRetention}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg, cfg.err
}

// WithRestartDelay caps how long a server that started less than a lock's
// TTL ago refuses names it has no fence counter for (default: the lock's
// TTL; 0: never, for servers that cannot have lost a holder's item). It is
// the URL's restart_delay=. It must not be negative.
func WithRestartDelay(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = fmt.Errorf("memcachelock: %w: WithRestartDelay(%v): negative", backend.ErrInvalidOption, d)
			return
		}
		c.restartDelay = d
	}
}

// DefaultRetention is how long a name's fence counter lives when no option
// or URL says otherwise.
const DefaultRetention = 24 * time.Hour

// WithRetention sets how long a name's fence counter lives after its seed
// (URL: retention=; default DefaultRetention), in whole seconds: incr keeps
// the seed's expiry, so the counter, the last of a released name, vanishes d
// after its seed, and the next acquisition seeds it again from the clock
// (see drawFence). d must be positive and at most 30 days.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 || d > maxTTL {
			c.err = fmt.Errorf("memcachelock: %w: WithRetention(%v): want more than 0, at most %v", backend.ErrInvalidOption, d, maxTTL)
			return
		}
		c.retention = d
	}
}

// retentionSeconds is the counter's expiration: whole seconds, rounded up.
func (c *config) retentionSeconds() int32 {
	return int32((c.retention + time.Second - 1) / time.Second)
}

// WithTimeout sets the read, write and dial timeout of each call of the
// client that Open makes (default 500ms). It is the URL's timeout=. It must
// be positive. New refuses it: set your client's Timeout instead.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.err = fmt.Errorf("memcachelock: %w: WithTimeout(%v): want a positive timeout", backend.ErrInvalidOption, d)
			return
		}
		c.timeout = d
	}
}

// WithMaxIdle sets how many idle connections per server the client that
// Open makes keeps (default 16). It is the URL's max_idle=. It must be at
// least 1. New refuses it: set your client's MaxIdleConns instead.
func WithMaxIdle(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.err = fmt.Errorf("memcachelock: %w: WithMaxIdle(%d): want at least 1", backend.ErrInvalidOption, n)
			return
		}
		c.maxIdle = n
	}
}
