package memcachelock

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// Usage is the URL form this package registers.
const Usage = "memcache://host1:11211[,host2:11211...][?timeout=500ms&max_idle=16&restart_delay=1m&retention=24h]  or  memcache:///path/to/memcached.sock"

const defaultPort = "11211"

func init() {
	backend.Register("memcache", backend.OpenerFunc(Usage, func(ctx context.Context, u *url.URL) (*Driver, error) {
		return openURL(ctx, u, nil)
	}))
}

// Open returns a driver for a memcache:// URL: a comma-separated server list
// (port 11211 by default) or the path of a Unix socket. Parameters: timeout
// (default 500ms), max_idle (default 16), restart_delay and retention, as
// the options WithTimeout, WithMaxIdle, WithRestartDelay and WithRetention
// set them; an option overrides the URL. Open pings every server, each
// within the timeout, and fails if one does not answer. Close closes the
// client that Open made.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "memcache")
	if err != nil {
		return nil, fmt.Errorf("memcachelock: %w", err)
	}
	return openURL(ctx, u, opts)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL, opts []Option) (*Driver, error) {
	servers, err := parseServers(u)
	if err != nil {
		return nil, err
	}
	p := backend.NewParams(u)
	timeout := p.Duration("timeout", memcache.DefaultTimeout)
	maxIdle := p.Int("max_idle", inFlight)
	retention := p.Duration("retention", DefaultRetention)
	restart := p.Duration("restart_delay", 0)
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("memcachelock: %w", err)
	}
	if timeout <= 0 || maxIdle < 1 || retention <= 0 || retention > maxTTL || restart < 0 {
		return nil, fmt.Errorf("memcachelock: %w: timeout must be positive, max_idle at least 1, retention more than 0 and at most %v, restart_delay not negative", backend.ErrInvalidURL, maxTTL)
	}
	// Before opts: an option overrides the URL.
	fromURL := []Option{WithTimeout(timeout), WithMaxIdle(maxIdle), WithRetention(retention)}
	if p.Has("restart_delay") {
		fromURL = append(fromURL, WithRestartDelay(restart))
	}
	cfg, err := newConfig(append(fromURL, opts...))
	if err != nil {
		return nil, err
	}
	timeout = cfg.timeout
	var sl memcache.ServerList
	if err := sl.SetServers(servers...); err != nil {
		return nil, fmt.Errorf("memcachelock: %w: %v", backend.ErrInvalidURL, err)
	}
	mc := memcache.NewFromSelector(&sl)
	mc.Timeout = timeout
	mc.MaxIdleConns = cfg.maxIdle
	// A context deadline sooner than the timeout bounds the first contact.
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < timeout {
			mc.Timeout = max(left, time.Millisecond)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memcachelock: open: %w", err)
	}
	err = mc.Ping()
	mc.Timeout = timeout
	if err != nil {
		mc.Close()
		return nil, fmt.Errorf("memcachelock: %w", err)
	}
	return &Driver{mc: mc, own: true, servers: &sl, restartMax: cfg.restartDelay, fenceExp: cfg.retentionSeconds(), slots: newSlots(len(servers))}, nil
}

// parseServers reads the server list from u's host (or a socket path).
func parseServers(u *url.URL) ([]string, error) {
	bad := func(why string) error {
		return fmt.Errorf("memcachelock: %w: %s", backend.ErrInvalidURL, why)
	}
	if u.User != nil {
		return nil, bad("memcached has no authentication in this client; remove the user info")
	}
	if u.Host == "" {
		if u.Path == "" || u.Path == "/" {
			return nil, bad("no server")
		}
		return []string{u.Path}, nil // a Unix socket
	}
	if u.Path != "" && u.Path != "/" {
		return nil, bad("unexpected path " + u.Path)
	}
	servers, err := backend.Hosts(u, defaultPort)
	if err != nil {
		return nil, fmt.Errorf("memcachelock: %w", err)
	}
	return servers, nil
}
