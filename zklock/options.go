package zklock

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"
)

// Defaults for connections the driver opens itself.
const (
	DefaultRoot           = "/locker"
	DefaultSessionTimeout = 10 * time.Second
	DefaultConnectTimeout = 5 * time.Second
)

// Option configures a Driver.
type Option func(*config)

type config struct {
	root           string
	acl            []zk.ACL
	sessionTimeout time.Duration
	connectTimeout time.Duration
	logger         *slog.Logger
	dialer         zk.Dialer
	tls            *tls.Config
	user, password string
	hasAuth        bool
}

// WithRoot sets the node under which lock nodes live (default "/locker").
// It is created, with its ancestors, when missing.
func WithRoot(root string) Option { return func(c *config) { c.root = root } }

// WithACL sets the ACL of every node the driver creates (default
// zk.WorldACL(zk.PermAll), or DigestACL with WithDigestAuth).
func WithACL(acl []zk.ACL) Option { return func(c *config) { c.acl = acl } }

// WithDigestAuth authenticates the connection the driver opens with the
// digest scheme and, unless WithACL says otherwise, gives its nodes
// DigestACL: a client without the credential can see who holds a lock but
// can neither take it nor delete the holder's node. With New, authenticate
// the *zk.Conn yourself and pass WithACL(DigestACL(user, password)).
func WithDigestAuth(user, password string) Option {
	return func(c *config) { c.user, c.password, c.hasAuth = user, password, true }
}

// WithSessionTimeout sets the session timeout the driver asks for on its
// own connection (default 10s; the server clamps it into its
// [minSessionTimeout, maxSessionTimeout]). With New, it tells the driver
// the *zk.Conn's, which go-zookeeper does not expose.
func WithSessionTimeout(d time.Duration) Option { return func(c *config) { c.sessionTimeout = d } }

// WithConnectTimeout bounds how long Dial, Open and New wait for a session
// (default 5s, and never longer than Dial's or Open's context allows).
func WithConnectTimeout(d time.Duration) Option { return func(c *config) { c.connectTimeout = d } }

// WithLogger routes the ZooKeeper client's messages, and the driver's own,
// to l at debug level (default: discarded).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithTLS makes the driver's own connection speak TLS with c (ZooKeeper's
// secureClientPort; URL: see backend.Params.TLS). The server's certificate
// is checked against the host dialled unless c names another.
func WithTLS(c *tls.Config) Option { return func(cfg *config) { cfg.tls = c } }

// WithDialer makes the driver's own connection dial with d (proxies,
// tests). The driver wraps its connections to cut them on Close; d should
// honour its timeout, since Close cannot interrupt a dial in progress.
func WithDialer(d zk.Dialer) Option { return func(c *config) { c.dialer = d } }

// DigestACL returns the ACL WithDigestAuth uses: every permission for the
// digest credential, read for everyone.
func DigestACL(user, password string) []zk.ACL {
	return append(zk.DigestACL(zk.PermAll, user, password), zk.WorldACL(zk.PermRead)...)
}

// defaults is the configuration opts make of the defaults.
func defaults(opts []Option) config {
	cfg := config{
		root:           DefaultRoot,
		sessionTimeout: DefaultSessionTimeout,
		connectTimeout: DefaultConnectTimeout,
		logger:         slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}
