package etcdlock

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Usage is the URL form of the etcd scheme.
const Usage = "etcd://[user[:password]@]host[:port][,host[:port]...][/prefix][?tls=true&ca=FILE&cert=FILE&key=FILE&server_name=NAME&skip_verify=false&dial_timeout=5s&keepalive_time=10s&keepalive_timeout=5s]"

// PasswordEnv is the environment variable read for the password when the
// URL names a user but no password.
const PasswordEnv = "ETCD_PASSWORD"

const defaultDialTimeout = 5 * time.Second

// gRPC keep-alive of the clients Open makes: a connection that stops
// answering (a silent partition) is dialled again instead of used until the
// lease runs out. 10s is gRPC's least and above etcd's
// --grpc-keepalive-min-time (5s), below which it closes the connection as
// too_many_pings. Pings go only while a request or a watch is in flight:
// etcd refuses pings on a connection without streams.
const (
	defaultKeepAliveTime    = 10 * time.Second
	defaultKeepAliveTimeout = 5 * time.Second
	minKeepAliveTime        = 10 * time.Second
	maxRedialPause          = 5 * time.Second
)

func init() {
	backend.Register("etcd", backend.OpenerFunc(Usage, func(ctx context.Context, u *url.URL) (*Driver, error) {
		return openURL(ctx, u, nil)
	}))
}

// Open connects to the etcd cluster that rawURL names (see the package
// doc) and returns a driver that owns the connection: Close closes it.
// Endpoints are separated by commas (port 2379 by default); Go's URL parser
// wants a port on the last of several, and an IPv6 literal only alone: for
// anything else, build a client and use New. WithPrefix, among opts,
// overrides the URL's prefix.
//
// Open checks that the credential may read and write under the prefix (an
// error wrapping backend.ErrPermission names what is missing; a refused
// password wraps it too). It fails within dial_timeout when the cluster
// cannot be reached, plus up to a second to find the cause that gRPC does
// not report (a TLS handshake or a connection refused).
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "etcd")
	if err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	return openURL(ctx, u, opts)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL, opts []Option) (*Driver, error) {
	cfg, prefix, err := clientConfig(u)
	if err != nil {
		return nil, err
	}
	dc := newConfig(append([]Option{WithPrefix(prefix)}, opts...))
	log := dc.logger
	if log == nil {
		log = backend.Logger(ctx)
	}
	cfg.Logger = zapLogger(log)
	backend.WarnTransport(log, u, cfg.TLS)
	cli, err := connect(ctx, cfg, dc.prefix)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	return newDriver(cli, true, dc), nil
}

// connect makes the client and checks its access to prefix. gRPC reports
// a refused handshake only as a deadline, so other failures are explained
// by a probe of the endpoints.
func connect(ctx context.Context, cfg clientv3.Config, prefix string) (*clientv3.Client, error) {
	cli, err := clientv3.New(cfg) // authenticates, within DialTimeout
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		err = checkAccess(pctx, cli, prefix, identity(cfg))
		cancel()
		if err != nil {
			cli.Close()
		}
	}
	switch {
	case err == nil:
		return cli, nil
	case errors.Is(err, backend.ErrPermission):
		return nil, err
	case errors.Is(permission(err), backend.ErrPermission):
		return nil, fmt.Errorf("authenticating %s: %w", identity(cfg), permission(err))
	case errors.Is(err, rpctypes.ErrNoSpace):
		// Reached, and refusing writes: not a network matter.
		return nil, fmt.Errorf("the cluster refuses writes (NOSPACE alarm: etcdctl alarm list): %w", err)
	}
	// Name the timeout that ran out: the caller's or dial_timeout.
	switch {
	case ctx.Err() != nil:
		err = context.Cause(ctx)
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("no answer within dial_timeout %v", cfg.DialTimeout)
	}
	if cause := probe(ctx, cfg); cause != nil {
		return nil, fmt.Errorf("cluster not reachable: %w (%w)", cause, err)
	}
	return nil, fmt.Errorf("cluster not reachable: %w", err)
}

// checkAccess checks the permissions the driver needs on prefix+"/": a
// read of at most one key, and a write in a transaction whose comparison
// never holds (etcd checks the permission of every operation in it).
func checkAccess(ctx context.Context, cli *clientv3.Client, prefix, who string) error {
	refused := func(err error, may string) error {
		if err := permission(err); errors.Is(err, backend.ErrPermission) {
			return fmt.Errorf("%w: %s may not %s the key prefix %s/ (the driver needs readwrite on it: etcdctl role grant-permission --prefix=true ROLE readwrite %[4]s/)", err, who, may, prefix)
		}
		return err
	}
	if _, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()); err != nil {
		return refused(err, "read")
	}
	key := prefix + "/" // in no lock's queue directory, so harmless even if written
	_, err := cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "<", 0)).
		Then(clientv3.OpPut(key, "")).Commit()
	if err != nil {
		return refused(err, "write under")
	}
	return nil
}

// identity names whom etcd takes the client for, for messages: the user,
// else the client certificate's common name.
func identity(cfg clientv3.Config) string {
	if cfg.Username != "" {
		return fmt.Sprintf("user %q", cfg.Username)
	}
	if cfg.TLS != nil && len(cfg.TLS.Certificates) > 0 {
		c := cfg.TLS.Certificates[0]
		if c.Leaf == nil && len(c.Certificate) > 0 {
			c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
		}
		if c.Leaf != nil {
			return fmt.Sprintf("user %q (the client certificate's CN)", c.Leaf.Subject.CommonName)
		}
	}
	return "the anonymous client"
}

// probeTimeout bounds the probe of each endpoint after a failed Open.
const probeTimeout = time.Second

// probe connects to each endpoint as gRPC would (TCP, the same TLS, the
// HTTP/2 preface) and returns the first failure, which gRPC does not pass
// on: an unknown CA, a rejected or missing client certificate, TLS against
// a plaintext port or the reverse; nil when every endpoint answers.
func probe(ctx context.Context, cfg clientv3.Config) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	eps := cfg.Endpoints
	return cmp.Or(parallel.Each(len(eps), len(eps), func(i int) error { return probeOne(ctx, eps[i], cfg.TLS) })...) // the first
}

func probeOne(ctx context.Context, ep string, tc *tls.Config) error {
	err := exchange(ctx, ep, tc)
	var ne net.Error
	var alert *net.OpError // a TLS alert sent by the server
	switch {
	case err == nil || ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()):
		return nil // it answers, or is slow: no cause to tell
	case tc == nil && speaksTLS(ctx, ep):
		return fmt.Errorf("%s: the server requires TLS (add ca=FILE, or tls=true, to the URL)", ep)
	case tc != nil && len(tc.Certificates) == 0 && errors.As(err, &alert) && alert.Op == "remote error":
		// Servers answer a missing client certificate with "bad
		// certificate" as often as with "certificate required".
		return fmt.Errorf("%s: %w (the server may require a client certificate: cert=FILE and key=FILE)", ep, err)
	}
	if strings.Contains(err.Error(), ep) {
		return err // a dial error names the address already
	}
	return fmt.Errorf("%s: %w", ep, err)
}

// exchange sends ep the HTTP/2 preface and an empty SETTINGS frame, and
// reads the first frame header of the answer: under TLS 1.3 a server that
// rejects our certificate says so only then.
func exchange(ctx context.Context, ep string, tc *tls.Config) error {
	conn, err := dial(ctx, ep, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		return err
	}
	_, err = io.ReadFull(conn, make([]byte, 9))
	return err
}

// speaksTLS reports whether ep completes a TLS handshake, whatever its
// certificate.
func speaksTLS(ctx context.Context, ep string) bool {
	conn, err := dial(ctx, ep, &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		conn.Close()
	}
	return err == nil
}

// dial connects to ep as gRPC does: over TLS, offering HTTP/2, if tc is set.
func dial(ctx context.Context, ep string, tc *tls.Config) (net.Conn, error) {
	if tc == nil {
		return (&net.Dialer{}).DialContext(ctx, "tcp", ep)
	}
	tc = tc.Clone()
	tc.NextProtos = []string{"h2"}
	return (&tls.Dialer{Config: tc}).DialContext(ctx, "tcp", ep)
}

// ClientConfig turns an etcd URL (see Open) into a client configuration
// and a key prefix, without connecting: for a client of your own, to use
// with New and WithPrefix(prefix).
func ClientConfig(rawURL string) (cfg clientv3.Config, prefix string, err error) {
	u, err := backend.ParseURL(rawURL, "etcd")
	if err != nil {
		return clientv3.Config{}, "", fmt.Errorf("etcdlock: %w", err)
	}
	return clientConfig(u)
}

func clientConfig(u *url.URL) (clientv3.Config, string, error) {
	fail := func(format string, args ...any) (clientv3.Config, string, error) {
		return clientv3.Config{}, "", fmt.Errorf("etcdlock: %w: %s", backend.ErrInvalidURL, fmt.Sprintf(format, args...))
	}
	endpoints, herr := backend.Hosts(u, "2379")
	p := backend.NewParams(u)
	tc, err := p.TLS(false)
	dial := cmp.Or(p.Duration("dial_timeout", defaultDialTimeout), defaultDialTimeout) // 0: the default
	kaTime := p.Duration("keepalive_time", defaultKeepAliveTime)
	kaTimeout := p.Duration("keepalive_timeout", defaultKeepAliveTimeout)
	if err := cmp.Or(herr, err, p.Err()); err != nil {
		return clientv3.Config{}, "", fmt.Errorf("etcdlock: %w", err)
	}
	switch {
	case kaTime > 0 && kaTime < minKeepAliveTime:
		return fail("keepalive_time=%v: want at least %v (gRPC's least), or 0 for no keep-alive", kaTime, minKeepAliveTime)
	case kaTime > 0 && kaTimeout == 0:
		return fail("keepalive_timeout=0: want more than 0")
	}
	cfg := clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          dial,
		DialKeepAliveTime:    kaTime,
		DialKeepAliveTimeout: kaTimeout,
		Logger:               zap.NewNop(),
		TLS:                  tc,
		// A connection that keep-alive closed is dialled again until the
		// path heals: gRPC's defaults (20s per handshake, pauses up to
		// 2 min) would keep a healed endpoint out of use that long.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxRedialPause},
			MinConnectTimeout: dial,
		})},
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		pw, ok := u.User.Password()
		if !ok {
			pw = os.Getenv(PasswordEnv)
		}
		if pw == "" {
			// Fail closed: etcd would run us as the client certificate's
			// identity, or with no authentication at all.
			return fail("no password for user %q (in the URL or %s); to authenticate by client certificate alone, name no user", cfg.Username, PasswordEnv)
		}
		cfg.Password = pw
	}
	return cfg, cleanPrefix(u.Path), nil
}
