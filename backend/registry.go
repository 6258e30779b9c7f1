package backend

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Opener opens a driver for the URLs of one scheme.
type Opener struct {
	// Usage shows the URL form, for help texts: "redis://[user:password@]host:port/db".
	Usage string
	// Open returns a driver for u. It rejects unknown query parameters with
	// ErrInvalidURL ([Params] helps) and should fail fast, within ctx, when
	// the store cannot be reached. ctx may carry the Client's logger
	// ([Logger]) and default lock TTL ([DefaultTTL]).
	Open func(ctx context.Context, u *url.URL) (Driver, error)
}

// OpenTimeout bounds a driver's Open whose ctx has no deadline.
const OpenTimeout = 10 * time.Second

// OpenContext is ctx, bounded by OpenTimeout when it has no deadline.
func OpenContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, OpenTimeout)
}

type defaultTTLKey struct{}

// WithDefaultTTL returns ctx carrying the default lock TTL of the Client
// an Opener's driver is for: locker.Open passes it when its URL (ttl=) or
// its options (locker.WithDefaultTTL) set one. A [Session] driver whose
// session timeout is fixed when it opens, whatever the Claims' TTLs (a
// ZooKeeper session), should use it as that timeout when its URL sets
// none, so that a crashed holder keeps others out for the TTL asked for,
// as on other backends. Drivers whose locks follow each Claim's TTL
// ignore it.
func WithDefaultTTL(ctx context.Context, ttl time.Duration) context.Context {
	return context.WithValue(ctx, defaultTTLKey{}, ttl)
}

// DefaultTTL returns the TTL WithDefaultTTL put in ctx, if it is positive.
func DefaultTTL(ctx context.Context) (time.Duration, bool) {
	ttl, ok := ctx.Value(defaultTTLKey{}).(time.Duration)
	return ttl, ok && ttl > 0
}

var (
	mu      sync.RWMutex
	openers = map[string]Opener{}
)

// Register makes a driver available under scheme. It panics if scheme is
// registered twice or opener.Open is nil, as database/sql.Register does:
// both are programming errors found at init.
func Register(scheme string, opener Opener) {
	mu.Lock()
	defer mu.Unlock()
	if opener.Open == nil {
		panic("backend: Register " + scheme + " with a nil Open")
	}
	if _, dup := openers[scheme]; dup {
		panic("backend: Register called twice for scheme " + scheme)
	}
	openers[scheme] = opener
}

// Scheme describes one registered scheme.
type Scheme struct {
	Name  string
	Usage string
}

// Schemes lists the registered schemes, sorted by name.
func Schemes() []Scheme {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Scheme, 0, len(openers))
	for name, o := range openers {
		out = append(out, Scheme{Name: name, Usage: o.Usage})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// packages names the package of each scheme this module provides, for the
// error that says which import is missing.
var packages = map[string]string{
	"mem": "memlock", "file": "filelock",
	"redis": "redislock", "rediss": "redislock",
	"redis+cluster": "redislock", "rediss+cluster": "redislock",
	"redis+quorum": "redislock", "rediss+quorum": "redislock",
	"etcd": "etcdlock", "zk": "zklock", "memcache": "memcachelock",
	"postgres": "sqllock", "postgresql": "sqllock",
}

// Open finds the driver for u's scheme and opens it.
func Open(ctx context.Context, u *url.URL) (Driver, error) {
	mu.RLock()
	o, ok := openers[u.Scheme]
	mu.RUnlock()
	if !ok {
		if pkg, known := packages[u.Scheme]; known {
			return nil, fmt.Errorf("%w: scheme %q is not registered: import _ \"github.com/lockerhq/locker/%s\"", ErrInvalidURL, u.Scheme, pkg)
		}
		var names []string
		for _, s := range Schemes() {
			names = append(names, s.Name)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: unknown scheme %q: no backend is registered (import its package)", ErrInvalidURL, u.Scheme)
		}
		return nil, fmt.Errorf("%w: unknown scheme %q: registered are %s (is the backend's package imported?)", ErrInvalidURL, u.Scheme, strings.Join(names, ", "))
	}
	return o.Open(ctx, u)
}

// OpenerFunc adapts a driver package's open function, which returns its
// own driver type, to an Opener (a nil *Driver returned with an error must
// not become a non-nil Driver).
func OpenerFunc[D Driver](usage string, open func(context.Context, *url.URL) (D, error)) Opener {
	return Opener{Usage: usage, Open: func(ctx context.Context, u *url.URL) (Driver, error) {
		d, err := open(ctx, u)
		if err != nil {
			return nil, err
		}
		return d, nil
	}}
}

// ParseURL parses rawURL for a driver's Open and, when schemes are given,
// checks that its scheme is one of them. Its errors wrap ErrInvalidURL and
// never quote the URL, which may hold a password.
func ParseURL(rawURL string, schemes ...string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot parse the URL", ErrInvalidURL)
	}
	if len(schemes) > 0 && !slices.Contains(schemes, u.Scheme) {
		return nil, fmt.Errorf("%w: scheme %q, want %s", ErrInvalidURL, u.Scheme, strings.Join(schemes, " or "))
	}
	return u, nil
}
