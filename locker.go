// Package locker is a distributed lock with pluggable backends.
//
// A [Client] holds the semantics once: blocking and non-blocking
// acquisition, TTLs, token-checked release and refresh, automatic refresh,
// the lost-lock signal, a label that tells operators who holds a lock,
// reentrancy for an explicit key and fencing tokens.
// A backend driver (package backend) only stores locks. Choose the backend
// by URL, after a blank import of its package:
//
//	import _ "github.com/lockerhq/locker/redislock"
//
//	c, err := locker.Open(ctx, "redis://127.0.0.1:6379/0?namespace=billing")
//	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
//		// ctx is cancelled if the lock is lost.
//		return run(ctx)
//	})
//
// or build the driver from a client you already have and call [New].
package locker

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
)

// Client acquires locks through one backend driver. It is safe for
// concurrent use. Close it to release its locks and stop its goroutines.
type Client struct {
	drv      backend.Driver
	queuer   backend.Queuer   // nil unless the store queues waiters (wait.go)
	notifier backend.Notifier // nil unless the driver notifies releases
	session  backend.Session  // nil unless a server-side session keeps locks alive
	modes    backend.ModeSet  // the modes besides Exclusive the driver takes
	weighs   bool             // Permit claims may weigh more than 1 (backend.Weigher)
	cfg      config

	gate backend.Gate   // calls in flight, ended and awaited by Close
	bg   sync.WaitGroup // releases of grants nobody holds, awaited by Close
	dog  *watchdog

	mu        sync.Mutex
	reentries map[reentryKey]*hold  // holds with a Reentrant key
	live      map[*hold]struct{}    // every hold not yet released, for Close
	late      []backend.Claim       // grants that arrived as Close began, for Close
	turns     map[object]*turnstile // this Client's waiters, per object (turnstile.go)
	waiting   atomic.Int64          // how many waiters the turnstiles hold
}

// reentryKey finds a Reentrant key's hold on one object (a read-write
// lock's readers and writer share one, so that a key cannot hold both
// sides).
type reentryKey struct {
	object
	reentrant string
}

// New returns a Client that uses drv, built from a store client the caller
// already has (like sql.OpenDB). The Client owns drv: Close closes it.
func New(drv backend.Driver, opts ...Option) (*Client, error) {
	if drv == nil {
		return nil, fmt.Errorf("locker: New: %w: nil driver", ErrUnsupported)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkNamespace(cfg.namespace); err != nil {
		return nil, fmt.Errorf("locker: New: %w", err)
	}
	if err := CheckLabel(cfg.label); err != nil {
		return nil, fmt.Errorf("locker: New: %w", err)
	}
	if err := CheckTTL(cfg.ttl); err != nil {
		return nil, fmt.Errorf("locker: New: WithDefaultTTL: %w", err)
	}
	if cfg.backoffMin <= 0 || cfg.backoffMax < cfg.backoffMin {
		return nil, fmt.Errorf("locker: New: %w: backoff bounds %v..%v", ErrUnsupported, cfg.backoffMin, cfg.backoffMax)
	}
	c := &Client{
		drv:       drv,
		cfg:       cfg,
		reentries: map[reentryKey]*hold{},
		live:      map[*hold]struct{}{},
		turns:     map[object]*turnstile{},
	}
	// Through wrappers too (see backend.Wrapper).
	c.queuer, _ = backend.As[backend.Queuer](drv)
	c.notifier, _ = backend.As[backend.Notifier](drv)
	c.session, _ = backend.As[backend.Session](drv)
	if m, ok := backend.As[backend.Modal](drv); ok {
		c.modes = m.Modes()
	}
	if w, ok := backend.As[backend.Weigher](drv); ok {
		c.weighs = w.Weighs()
	}
	c.dog = newWatchdog(c)
	return c, nil
}

// Open returns a Client for a backend URL such as "redis://host:6379/0".
// The driver's package must be imported (a blank import is enough). Two
// parameters belong to the Client and work with every scheme: namespace
// (see WithNamespace) and ttl (see WithDefaultTTL); they override opts.
// A default TTL, from either, also reaches the driver (see
// backend.WithDefaultTTL): on ZooKeeper, whose locks live as long as a
// session, it is the session timeout unless the URL sets session_timeout.
// Any parameter that neither the Client nor the driver knows is an error.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	u, uopts, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	opts = append(opts, uopts...)
	// Check the Client's settings before the driver dials anything.
	cfg, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	// The driver logs where the Client does (its warnings: weak transport,
	// an evicting Redis), and learns the default TTL if one was set.
	drv, err := backend.Open(openerContext(backend.WithLogger(ctx, cfg.logger), opts), u)
	if err != nil {
		return nil, fmt.Errorf("locker: Open %s: %w", backend.Redacted(u), err)
	}
	c, err := New(drv, opts...)
	if err != nil {
		drv.Close()
		return nil, err
	}
	return c, nil
}

// OpenDriver opens the driver for rawURL as Open does, without a Client,
// and returns the Client options that the URL's namespace and ttl
// parameters stand for. It serves callers that wrap the driver (to count
// or trace its calls) before they call New.
func OpenDriver(ctx context.Context, rawURL string) (backend.Driver, []Option, error) {
	u, opts, err := parseURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	if _, err := checkOptions(opts); err != nil {
		return nil, nil, err
	}
	drv, err := backend.Open(openerContext(ctx, opts), u)
	if err != nil {
		return nil, nil, fmt.Errorf("locker: Open %s: %w", backend.Redacted(u), err)
	}
	return drv, opts, nil
}

// openerContext adds to ctx the default TTL that opts set, if they set
// one (see backend.WithDefaultTTL): a driver whose locks live as long as a
// session sizes the session by it, but only when the caller asked for a
// TTL, so that its own default otherwise stays.
func openerContext(ctx context.Context, opts []Option) context.Context {
	var set config
	for _, o := range opts {
		o(&set)
	}
	if set.ttl > 0 {
		ctx = backend.WithDefaultTTL(ctx, set.ttl)
	}
	return ctx
}

// parseURL splits the Client's own parameters off rawURL.
func parseURL(rawURL string) (*url.URL, []Option, error) {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil && !strings.Contains(rawURL, "://"), err == nil && u.Scheme == "",
		err == nil && u.Opaque != "" && !registered(u.Scheme): // host:port, user:password@host parse as scheme:opaque
		return nil, nil, fmt.Errorf("locker: Open: %w: %s", ErrInvalidURL, noScheme(rawURL))
	case err != nil:
		return nil, nil, fmt.Errorf("locker: Open: %w: %v", ErrInvalidURL, redactURLError(err))
	}
	var opts []Option
	q := u.Query()
	for _, name := range []string{"namespace", "ttl"} {
		if n := len(q[name]); n > 1 {
			return nil, nil, fmt.Errorf("locker: Open: %w: parameter %s given %d times", ErrInvalidURL, name, n)
		}
	}
	if ns, ok := q["namespace"]; ok {
		opts = append(opts, WithNamespace(ns[0]))
		q.Del("namespace")
	}
	if s, ok := q["ttl"]; ok {
		ttl, err := time.ParseDuration(s[0])
		if err != nil {
			return nil, nil, fmt.Errorf("locker: Open: %w: ttl=%q is not a duration such as 30s or 5m", ErrInvalidURL, s[0])
		}
		if CheckTTL(ttl) != nil {
			return nil, nil, fmt.Errorf("locker: Open: %w: ttl=%s: a lock's TTL must be more than 0 and at most %v", ErrInvalidTTL, s[0], MaxTTL)
		}
		opts = append(opts, WithDefaultTTL(ttl))
		q.Del("ttl")
	}
	u.RawQuery = q.Encode()
	return u, opts, nil
}

// checkOptions reports the first option New would reject for its
// namespace or default TTL.
func checkOptions(opts []Option) (config, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkNamespace(cfg.namespace); err != nil {
		return cfg, fmt.Errorf("locker: Open: %w", err)
	}
	if err := CheckLabel(cfg.label); err != nil {
		return cfg, fmt.Errorf("locker: Open: %w", err)
	}
	if err := CheckTTL(cfg.ttl); err != nil {
		return cfg, fmt.Errorf("locker: Open: WithDefaultTTL: %w", err)
	}
	return cfg, nil
}

// defaultPorts names the backend whose server listens on a port by
// default, for the hint to a URL given as host:port.
var defaultPorts = map[string]string{"6379": "redis", "2379": "etcd", "2181": "zk", "11211": "memcache", "5432": "postgres"}

var hostPort = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]+$`)

// noScheme says that raw lacks a scheme, and what to write instead. It
// quotes raw only when it is host:port, so never a password.
func noScheme(raw string) string {
	var names []string
	for _, s := range backend.Schemes() {
		names = append(names, s.Name)
	}
	hp := hostPort.MatchString(raw)
	guess := defaultPorts[raw[strings.LastIndexByte(raw, ':')+1:]]
	switch {
	case hp && guess != "":
		return fmt.Sprintf("no scheme in %q: did you mean %s://%s?", raw, guess, raw)
	case len(names) == 0:
		return "no scheme, and no backend is registered: import one, such as _ \"github.com/lockerhq/locker/redislock\""
	case hp:
		return fmt.Sprintf("no scheme in %q: did you mean SCHEME://%s, SCHEME one of %s?", raw, raw, strings.Join(names, ", "))
	default:
		return "no scheme: a backend URL starts with one of " + strings.Join(names, ", ") + ", then ://"
	}
}

// registered reports whether scheme has a driver.
func registered(scheme string) bool {
	for _, s := range backend.Schemes() {
		if s.Name == scheme {
			return true
		}
	}
	return false
}

// redactURLError keeps a password in a malformed URL out of error messages.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			return fmt.Errorf("%s %s: %v", ue.Op, backend.Redacted(u), ue.Err)
		}
		return fmt.Errorf("%s: %v", ue.Op, ue.Err)
	}
	return err
}

// Driver returns the Client's backend driver, for type assertions to a
// backend package's own types.
func (c *Client) Driver() backend.Driver { return c.drv }

// closeDrainBy is when, after it began, Close stops waiting for driver
// calls that outlived their contexts (closing the driver should have ended
// them): Close's whole budget is 3 s, and the driver's Close may have used
// up to 2 s of it after the releases' 1 s.
const closeDrainBy = 2500 * time.Millisecond

// maxClosing bounds the releases Close has in flight at once.
const maxClosing = 64

// Close releases every lock the Client holds (their Lost channels close with
// ErrClosed), ends waiting acquisitions with ErrClosed, stops the watchdog
// and closes the driver. Later calls return ErrClosed. Close is idempotent.
// It returns within 3 seconds, the store reachable or not, given a driver
// that keeps its contract (see backend.Driver): calls in flight end within
// a round trip, the releases get 1 second, the driver's Close up to 2 more.
func (c *Client) Close() error {
	began := time.Now()
	// Calls in flight return as their contexts end; one that took a lock
	// meanwhile has put it in live, or abandoned it on seeing the gate shut.
	if !c.gate.Close() {
		return nil
	}
	c.dog.stop()
	c.mu.Lock()
	holds := make([]*hold, 0, len(c.live))
	for h := range c.live {
		holds = append(holds, h)
	}
	late := c.late
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), closeReleaseTimeout)
	defer cancel()
	parallel.Each(len(holds)+len(late), maxClosing, func(i int) error {
		cl := backend.Claim{}
		if i < len(holds) {
			h := holds[i]
			h.loseBy(LostClosed, fmt.Errorf("locker: %q: %w", h.name, ErrClosed))
			cl = h.lock()
		} else {
			cl = late[i-len(holds)]
		}
		return c.errCall(ctx, func(ctx context.Context) error { return c.drv.Release(ctx, cl) })
	})
	err := c.drv.Close()
	// Closing the driver ends the calls that outlived their contexts; a
	// driver that breaks that promise must not hang Close.
	drainUntil := began.Add(closeDrainBy)
	parallel.Wait(&c.dog.busy, time.Until(drainUntil))
	parallel.Wait(&c.bg, time.Until(drainUntil))
	return err
}
