package etcdlock

import (
	"cmp"
	"log/slog"
	"strings"
)

// config is what the options set.
type config struct {
	prefix string
	logger *slog.Logger // nil: backend.Logger of Open's context
}

// Option configures a driver made by New or Open.
type Option func(*config)

func newConfig(opts []Option) config {
	cfg := config{prefix: DefaultPrefix}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// WithPrefix sets the etcd key prefix under which locks live (default
// DefaultPrefix; the URL's path). Drivers that should see each other's
// locks must use the same prefix.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = cleanPrefix(prefix) }
}

func cleanPrefix(p string) string { return cmp.Or(strings.TrimRight(p, "/"), DefaultPrefix) }

// WithLogger sends the messages of the etcd client that Open makes to l,
// at their own level. Without it, Open uses the logger in its context
// (backend.Logger: locker.Open passes its Client's). A client given to New
// logs where its own Config.Logger says.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}
