package etcdlock

import "strings"

// config is what the options set.
type config struct {
	prefix string
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

func cleanPrefix(p string) string {
	p = strings.TrimRight(p, "/")
	if p == "" {
		return DefaultPrefix
	}
	return p
}
