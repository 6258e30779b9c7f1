package redislock

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
)

func init() {
	for _, s := range []string{"", "s"} {
		r := "redis" + s
		backend.Register(r, backend.Opener{
			Usage: r + "://[user:password@]host:port/db[?fair=true&restart_delay=&retention=&TLS&go-redis options]",
			Open:  openAny,
		})
		backend.Register(r+"+cluster", backend.Opener{
			Usage: r + "+cluster://[user:password@]host:port,host:port,...[?fair=true&restart_delay=&retention=&TLS&go-redis cluster options]",
			Open:  openAny,
		})
		backend.Register(r+"+quorum", backend.OpenerFunc(r+"+quorum://[user:password@]host:port,host:port,host:port/db[?restart_delay=&retention=&TLS&go-redis options]",
			func(ctx context.Context, u *url.URL) (*Quorum, error) { return openQuorum(ctx, u, nil) }))
	}
}

// openAny is the registry's opener: a FairDriver when fair=true.
func openAny(ctx context.Context, u *url.URL) (backend.Driver, error) {
	d, err := open(ctx, u, nil, nil)
	switch {
	case err != nil:
		return nil, err
	case d.fair:
		return &FairDriver{d}, nil
	}
	return d, nil
}

// ownParams takes the driver's own parameters off u: fair, restart_delay and retention (Options after opts: the URL has
// the last word) and the TLS ones (backend.Params.TLS; rediss implies
// TLS), which replace go-redis's TLS configuration. It returns the options'
// config, with ctx's logger first, and warns of a weak transport.
func ownParams(ctx context.Context, u *url.URL, opts []Option) (_ *url.URL, _ config, _ *tls.Config, fair bool, _ error) {
	if u.Opaque != "" { // go-redis would dial localhost:6379 for "redis:pw@host"
		return nil, config{}, nil, false, fmt.Errorf("redislock: %w: want %s://[user:password@]host:port/db, with the two slashes", backend.ErrInvalidURL, u.Scheme)
	}
	if err := checkUser(u); err != nil {
		return nil, config{}, nil, false, err
	}
	q := u.Query()
	own := url.Values{}
	for name, vs := range q {
		switch name {
		case "fair", "restart_delay", "retention", "tls", "ca", "cert", "key", "server_name", "skip_verify":
			own[name] = vs
			q.Del(name)
		}
	}
	opts = append([]Option{WithLogger(backend.Logger(ctx))}, opts...)
	var tc *tls.Config
	if len(own) > 0 || strings.HasPrefix(u.Scheme, "rediss") {
		p := backend.NewParams(&url.URL{RawQuery: own.Encode()})
		fair = p.Bool("fair", false)
		delay := p.Duration("restart_delay", -1)
		retention := p.Duration("retention", 0)
		var err error
		tc, err = p.TLS(strings.HasPrefix(u.Scheme, "rediss"))
		if err == nil {
			err = p.Err()
		}
		if err != nil {
			return nil, config{}, nil, false, fmt.Errorf("redislock: %w", err)
		}
		if delay >= 0 {
			opts = append(opts, WithRestartDelay(delay))
		}
		if p.Has("retention") {
			if retention <= 0 {
				return nil, config{}, nil, false, fmt.Errorf("redislock: %w: retention=%s: want a positive duration", backend.ErrInvalidURL, own.Get("retention"))
			}
			opts = append(opts, WithRetention(retention))
		}
		c := *u
		c.RawQuery = q.Encode()
		u = &c
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, config{}, nil, false, err
	}
	backend.WarnTransport(backend.Logger(ctx), u, tc)
	installLogRouter()
	return u, cfg, tc, fair, nil
}

// checkUser refuses a URL that names a user but no password: go-redis
// would then skip AUTH and run as the default user, whatever its rights.
// Redis has no identity by client certificate to fall back on.
func checkUser(u *url.URL) error {
	if u.User == nil || u.User.Username() == "" {
		return nil
	}
	if pw, _ := u.User.Password(); pw != "" {
		return nil
	}
	return fmt.Errorf("redislock: %w: no password for user %q: Redis would run the connection as the default user; put the password in the URL (lockctl: ${VAR})",
		backend.ErrInvalidURL, u.User.Username())
}

// withTLS puts tc in place of go-redis's TLS configuration, checking the
// certificate against addr's host unless server_name named another.
func withTLS(dst **tls.Config, tc *tls.Config, addr string) {
	if tc == nil {
		return
	}
	tc = tc.Clone()
	if tc.ServerName == "" {
		tc.ServerName, _, _ = net.SplitHostPort(addr)
	}
	*dst = tc
}

// OpenFair is Open for a FairDriver; the URL may say fair=true.
func OpenFair(ctx context.Context, rawURL string, opts ...Option) (*FairDriver, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	d, err := open(ctx, u, opts, new(true))
	if err != nil {
		return nil, err
	}
	return &FairDriver{d}, nil
}

func parseURL(rawURL string) (*url.URL, error) {
	u, err := backend.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	return u, nil
}

// Open connects to the deployment that rawURL names (redis://, rediss://,
// redis+cluster://, rediss+cluster://; see the package documentation;
// fair=true is OpenFair's) and returns a Driver that owns the connection.
// It pings the server, within ctx or 10 seconds, and checks its
// maxmemory-policy once.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return open(ctx, u, opts, new(false))
}

// open is Open (fair false), OpenFair (fair true) and the registry's opener
// (fair nil: as the URL says).
func open(ctx context.Context, u *url.URL, opts []Option, fair *bool) (*Driver, error) {
	u, cfg, tc, urlFair, err := ownParams(ctx, u, opts)
	switch {
	case err != nil:
		return nil, err
	case fair == nil:
		fair = &urlFair
	case urlFair && !*fair:
		return nil, fmt.Errorf("redislock: %w: fair=true needs OpenFair", backend.ErrInvalidURL)
	}
	var rdb redis.UniversalClient
	var in *conntrack.Tracker
	switch u.Scheme {
	case "redis", "rediss":
		o, err := serverOptions(u, tc)
		if err != nil {
			return nil, err
		}
		in = interruptible(o)
		rdb = redis.NewClient(o)
	case "redis+cluster", "rediss+cluster":
		o, err := clusterOptions(u)
		if err != nil {
			return nil, err
		}
		withTLS(&o.TLSConfig, tc, o.Addrs[0])
		in = interruptibleCluster(o)
		rdb = redis.NewClusterClient(o)
	default:
		return nil, fmt.Errorf("redislock: %w: scheme %q (want redis, rediss, redis+cluster or rediss+cluster; redis+quorum: OpenQuorum)", backend.ErrInvalidURL, u.Scheme)
	}
	ctx, cancel := backend.OpenContext(ctx)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redislock: %w", classify(err))
	}
	dep := newDeployment(rdb, in, &cfg)
	dep.checkMaxmemory(ctx, u.Host)
	return &Driver{dep: dep, fair: *fair}, nil
}

// clusterOptions turns redis+cluster://h1:p1,h2:p2?opts into go-redis's
// own form, redis://h1:p1?addr=h2:p2&opts, and parses that.
func clusterOptions(u *url.URL) (*redis.ClusterOptions, error) {
	hosts, err := backend.Hosts(u, defaultPort)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("redislock: %w: a cluster has no database number", backend.ErrInvalidURL)
	}
	c := *u
	c.Scheme = strings.TrimSuffix(u.Scheme, "+cluster")
	c.Host = hosts[0]
	c.Path = ""
	q := c.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	c.RawQuery = q.Encode()
	o, err := redis.ParseClusterURL(c.String())
	if err != nil {
		return nil, fmt.Errorf("redislock: %w: %v", backend.ErrInvalidURL, err)
	}
	return o, nil
}

// serverOptions are go-redis's options for the one server of u, with tc
// (see withTLS) and go-redis's own retries off unless the URL sets them
// (max_retries=, dialer_retries=): the Client already retries store
// failures within its budget, and go-redis's would make a refused
// connection take half a second to report.
func serverOptions(u *url.URL, tc *tls.Config) (*redis.Options, error) {
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("redislock: %w: %v", backend.ErrInvalidURL, err)
	}
	withTLS(&o.TLSConfig, tc, o.Addr)
	q := u.Query()
	if !q.Has("max_retries") {
		o.MaxRetries = -1
	}
	if !q.Has("dialer_retries") {
		o.DialerRetries = 1
	}
	return o, nil
}

// defaultPort is Redis's, for a listed host without one.
const defaultPort = "6379"

// OpenQuorum connects to N independent servers (redis+quorum:// or
// rediss+quorum://, with one set of credentials, database and go-redis
// options) and returns a Quorum that owns the connections. Unless the URL
// sets max_retries, a failed command is not retried: it is one vote, and
// the others decide without waiting. It fails when fewer than a majority
// answer a PING within ctx (or 10 seconds).
func OpenQuorum(ctx context.Context, rawURL string, opts ...Option) (*Quorum, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return openQuorum(ctx, u, opts)
}

// openQuorum is OpenQuorum and the registry's opener for +quorum.
func openQuorum(ctx context.Context, u *url.URL, opts []Option) (*Quorum, error) {
	if u.Scheme != "redis+quorum" && u.Scheme != "rediss+quorum" {
		return nil, fmt.Errorf("redislock: %w: scheme %q (want redis+quorum or rediss+quorum)", backend.ErrInvalidURL, u.Scheme)
	}
	if u.Query().Has("fair") {
		return nil, fmt.Errorf("redislock: %w: quorum mode has no fair queue", backend.ErrInvalidURL)
	}
	u, cfg, tc, _, err := ownParams(ctx, u, opts)
	if err != nil {
		return nil, err
	}
	hosts, err := backend.Hosts(u, defaultPort)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	// Every server's options first: a bad URL leaves no client to close.
	var options []*redis.Options
	for _, h := range hosts {
		c := *u
		c.Scheme = strings.TrimSuffix(u.Scheme, "+quorum")
		c.Host = h
		// A refused connection is one lost vote, not to be waited for.
		o, err := serverOptions(&c, tc)
		if err != nil {
			return nil, err
		}
		options = append(options, o)
	}
	var deps []*deployment
	for _, o := range options {
		in := interruptible(o) // before the client copies o
		deps = append(deps, newDeployment(redis.NewClient(o), in, &cfg))
	}
	q := newQuorum(deps, hosts, cfg)
	ctx, cancel := backend.OpenContext(ctx)
	defer cancel()
	// Wait for a majority, not a silent server; later answers are checked.
	deadline, _ := ctx.Deadline() // OpenContext's ctx has one
	warn := func(i int, r result) {
		if r.err != nil {
			cfg.logger.Warn("redislock: quorum server unreachable at open", "server", hosts[i], "err", r.err)
		}
	}
	res := q.gather(ctx, time.Until(deadline), false, func(ctx context.Context, i int) result {
		dep := q.deps[i]
		err := classify(dep.rdb.Ping(ctx).Err())
		if err == nil {
			dep.checkMaxmemory(ctx, hosts[i])
		}
		return result{ok: err == nil, err: err}
	}, func(ok, _ int) bool { return ok >= q.quorum }, warn)
	if up, _ := count(res); up < q.quorum {
		q.Close()
		return nil, fmt.Errorf("redislock: %d of %d servers answered, %d needed: %s", up, len(hosts), q.quorum, q.errSummary(res))
	}
	for i, r := range res {
		warn(i, r)
	}
	return q, nil
}
