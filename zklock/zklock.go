package zklock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// Defaults for connections the driver opens itself.
const (
	DefaultRoot           = "/locker"
	DefaultSessionTimeout = 10 * time.Second
	DefaultConnectTimeout = 5 * time.Second
)

// ErrSessionExpired is wrapped by the error of an acquisition whose
// ZooKeeper session expired while it waited in the queue: its queue node is
// gone with the session.
var ErrSessionExpired = errors.New("zklock: session expired")

func init() {
	backend.Register("zk", backend.Opener{
		Usage: "zk://[user:password@]host1:2181[,host2:2181...][/root]?session_timeout=10s&connect_timeout=5s[&ca=FILE&cert=FILE&key=FILE&server_name=NAME]",
		Open:  Open,
	})
}

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

// WithACL sets the ACL of every node the driver creates. The default is
// zk.WorldACL(zk.PermAll), or, with WithDigestAuth, all permissions for the
// credential and read for everyone else.
func WithACL(acl []zk.ACL) Option { return func(c *config) { c.acl = acl } }

// WithDigestAuth authenticates the connection the driver opens with the
// digest scheme ("user:password") and, unless WithACL says otherwise, gives
// every node it creates the ACL "all for this credential, read for
// everyone": a client without the credential can see who holds a lock but
// can neither take it nor delete the holder's node. With New, authenticate
// the *zk.Conn yourself and pass the ACL with WithACL (see DigestACL).
func WithDigestAuth(user, password string) Option {
	return func(c *config) { c.user, c.password, c.hasAuth = user, password, true }
}

// WithSessionTimeout sets the session timeout the driver asks for when it
// opens its own connection (default 10s; the server clamps it into its
// [minSessionTimeout, maxSessionTimeout], 2 to 20 ticks by default). With
// New, it tells the driver the negotiated timeout of the *zk.Conn when the
// driver cannot read it from the connection.
func WithSessionTimeout(d time.Duration) Option { return func(c *config) { c.sessionTimeout = d } }

// WithConnectTimeout bounds how long Dial waits for a session (default 5s,
// and never longer than its context allows).
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

// WithDialer makes the connection the driver opens dial servers with d
// (for TLS, proxies, tests). The driver wraps the connections it returns to
// read the session's timeout and to cut them on Close; d should honour its
// timeout argument, since Close cannot interrupt a dial in progress.
func WithDialer(d zk.Dialer) Option { return func(c *config) { c.dialer = d } }

// DigestACL returns the ACL WithDigestAuth uses: every permission for the
// digest credential, read for everyone.
func DigestACL(user, password string) []zk.ACL {
	return append(zk.DigestACL(zk.PermAll, user, password), zk.WorldACL(zk.PermRead)...)
}

func defaults() config {
	return config{
		root:           DefaultRoot,
		sessionTimeout: DefaultSessionTimeout,
		connectTimeout: DefaultConnectTimeout,
		logger:         slog.New(slog.DiscardHandler),
	}
}

// Driver is the ZooKeeper backend: one session per Driver, one ephemeral
// sequential node per acquisition. It implements backend.Driver,
// backend.Waiter and backend.Session.
type Driver struct {
	conn   *zk.Conn
	own    bool            // the driver opened conn and closes it
	events <-chan zk.Event // own connections: closed when conn's goroutines end
	wire   *wire           // own connections: session timeout and credentials
	dialed *dialed         // own connections: what Close cuts
	hosts  *hostList       // own connections
	root   string
	acl    []zk.ACL
	digest string        // with WithDigestAuth: our digest id, "user:hash"
	ttl    time.Duration // the negotiated session timeout
	log    *slog.Logger

	pmu     sync.Mutex
	parents map[string]struct{} // names' nodes seen to exist (the server deletes them when empty)

	mu     sync.Mutex
	closed bool
	holds  map[string]*held // by token
	wg     sync.WaitGroup   // goroutines the driver started
	done   chan struct{}    // closed by Close
	wake   chan struct{}    // session events for the monitor

	last    atomic.Pointer[contact] // the latest answered request
	shut    atomic.Bool             // Close has begun
	resumed chan struct{}           // a session again: ping now
	since   atomic.Int64            // own connections: when the zk client last had a session again (UnixNano), 0 while it has none

	testHookWatch func() // tests: called before a waiter watches its predecessor
}

var (
	_ backend.Driver  = (*Driver)(nil)
	_ backend.Waiter  = (*Driver)(nil)
	_ backend.Session = (*Driver)(nil)
)

// Open opens a driver for a zk:// URL:
//
//	zk://[user:password@]host1:2181[,host2:2181...][/root][?session_timeout=10s&connect_timeout=5s&TLS]
//
// TLS (ZooKeeper's secureClientPort) takes the parameters every backend
// reads: tls=true, ca=FILE, cert=FILE, key=FILE, server_name=NAME,
// skip_verify=true (see WithTLS).
//
// A port may be left out (2181) except on the last host, which url.Parse
// checks; a list of IPv6 literals does not parse as a URL (use Dial).
// The path is the root node (default /locker). A user and password
// authenticate with the digest scheme and protect the nodes with an ACL
// (see WithDigestAuth).
func Open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	servers, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	log := backend.Logger(ctx)
	var probe config
	for _, o := range opts {
		o(&probe)
	}
	backend.WarnTransport(log, u, probe.tls)
	d, err := Dial(ctx, servers, append([]Option{WithLogger(log)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func parseURL(u *url.URL) ([]string, []Option, error) {
	if u.Scheme != "zk" {
		return nil, nil, fmt.Errorf("zklock: %w: scheme %q, want zk", backend.ErrInvalidURL, u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, nil, fmt.Errorf("zklock: %w: want zk://host:port[,host:port...][/root]", backend.ErrInvalidURL)
	}
	var servers []string
	for _, s := range strings.Split(u.Host, ",") {
		if s == "" {
			return nil, nil, fmt.Errorf("zklock: %w: empty server address", backend.ErrInvalidURL)
		}
		if !strings.Contains(s, ":") || strings.HasSuffix(s, "]") {
			s += ":2181"
		}
		servers = append(servers, s)
	}
	var opts []Option
	root := u.Path
	if root == "" || root == "/" {
		root = DefaultRoot
	}
	if err := checkRoot(root); err != nil {
		return nil, nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidURL, err)
	}
	opts = append(opts, WithRoot(root))
	if u.User != nil {
		pass, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, nil, fmt.Errorf("zklock: %w: digest auth needs user:password", backend.ErrInvalidURL)
		}
		opts = append(opts, WithDigestAuth(u.User.Username(), pass))
	}
	p := backend.NewParams(u)
	st := p.Duration("session_timeout", DefaultSessionTimeout)
	ct := p.Duration("connect_timeout", DefaultConnectTimeout)
	tc, err := p.TLS(false)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("zklock: %w", err)
	}
	if tc != nil {
		opts = append(opts, WithTLS(tc))
	}
	if st <= 0 || ct <= 0 {
		return nil, nil, fmt.Errorf("zklock: %w: session_timeout and connect_timeout must be positive", backend.ErrInvalidURL)
	}
	opts = append(opts, WithSessionTimeout(st), WithConnectTimeout(ct))
	return servers, opts, nil
}

// checkRoot accepts an absolute ZooKeeper path without a trailing slash,
// empty, "." or ".." segments or characters ZooKeeper refuses.
func checkRoot(root string) error {
	if !strings.HasPrefix(root, "/") || root == "/" || strings.HasSuffix(root, "/") {
		return fmt.Errorf("root %q: want an absolute path such as /locker", root)
	}
	for _, seg := range strings.Split(root[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("root %q: empty, . or .. segment", root)
		}
		for _, r := range seg {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				return fmt.Errorf("root %q: character %U not allowed in ZooKeeper paths", root, r)
			}
		}
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return fmt.Errorf("root %q: /zookeeper is reserved", root)
	}
	return nil
}

// Dial connects to the servers ("host:port") and waits, within ctx and the
// connect timeout, for a session. The driver owns the connection: Close
// closes it, which ends the session and frees its locks at once.
func Dial(ctx context.Context, servers []string, opts ...Option) (*Driver, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkRoot(cfg.root); err != nil {
		return nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidURL, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("zklock: %w: no servers", backend.ErrInvalidURL)
	}
	if cfg.sessionTimeout <= 0 {
		return nil, fmt.Errorf("zklock: session timeout %v: %w", cfg.sessionTimeout, backend.ErrInvalidURL)
	}
	if cfg.acl == nil {
		if cfg.hasAuth {
			cfg.acl = DigestACL(cfg.user, cfg.password)
		} else {
			cfg.acl = zk.WorldACL(zk.PermAll)
		}
	}
	d := newDriver(cfg)
	d.own = true
	if cfg.hasAuth {
		d.digest = zk.DigestACL(0, cfg.user, cfg.password)[0].ID
	}
	d.wire = &wire{}
	d.dialed = newDialed()
	d.hosts = &hostList{}
	tr := newTrace(cfg.tls, d.dialed.dialer(cfg.dialer))
	conn, events, err := zk.Connect(servers, cfg.sessionTimeout,
		zk.WithLogger(zkLogger{cfg.logger}),
		zk.WithLogInfo(false),
		zk.WithDialer(d.wire.dialer(tr.dialer)),
		zk.WithHostProvider(d.hosts),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
				d.since.Store(time.Now().UnixNano())
				d.resume()
			} else if ev.Type == zk.EventSession {
				d.since.Store(0)
			}
			d.nodeEvent(ev)
			d.poke()
		}),
	)
	if err != nil {
		d.dialed.cut()
		return nil, fmt.Errorf("zklock: connect: %w", err)
	}
	d.conn, d.events = conn, events

	wctx, cancel := context.WithTimeout(ctx, cfg.connectTimeout)
	defer cancel()
	fail := func(err error) (*Driver, error) {
		d.closeConn()
		return nil, err
	}
	n := d.hosts.Len()
	if err := waitSessionOr(wctx, conn, func() error { return tr.refused(n) }); err != nil {
		if cause := tr.cause(); cause != nil && !errors.As(err, new(permanentErr)) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return fail(fmt.Errorf("zklock: connect to %s: %w", strings.Join(servers, ","), err))
	}
	if cfg.hasAuth {
		if err := conn.AddAuth("digest", []byte(cfg.user+":"+cfg.password)); err != nil {
			return fail(fmt.Errorf("zklock: digest auth: %w", err))
		}
	}
	d.ttl = time.Duration(d.wire.timeoutMs.Load()) * time.Millisecond
	if d.ttl <= 0 {
		d.ttl = cfg.sessionTimeout
	}
	if err := d.checkACL(d.root); err != nil {
		return fail(fmt.Errorf("zklock: root: %w", err))
	}
	if err := d.checkPerms(wctx); err != nil {
		return fail(fmt.Errorf("zklock: %w", err))
	}
	d.start()
	return d, nil
}

// New returns a driver that uses conn, a connection the caller built (and
// authenticated, if its nodes need ACLs: pass them with WithACL). The
// driver does not close conn. The session timeout it reports is the one
// conn negotiated, or WithSessionTimeout's when given.
//
// The driver times its locks as with Dial, from the requests it sends on
// conn and their answers (see the package doc), but sees an expired
// session only when it polls conn (every tenth of the timeout, at most a
// second) or when one of its requests finds a new session.
func New(conn *zk.Conn, opts ...Option) (*Driver, error) {
	if conn == nil {
		return nil, fmt.Errorf("zklock: New: nil *zk.Conn: %w", backend.ErrUnsupported)
	}
	cfg := defaults()
	cfg.sessionTimeout = 0
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkRoot(cfg.root); err != nil {
		return nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidURL, err)
	}
	if cfg.acl == nil {
		cfg.acl = zk.WorldACL(zk.PermAll)
	}
	d := newDriver(cfg)
	d.conn = conn
	d.ttl = cfg.sessionTimeout
	if d.ttl <= 0 {
		d.ttl = negotiatedTimeout(conn)
	}
	if d.ttl <= 0 {
		return nil, fmt.Errorf("zklock: New: cannot read the session timeout of the connection; pass WithSessionTimeout: %w", backend.ErrUnsupported)
	}
	if err := d.checkACL(d.root); err != nil {
		return nil, fmt.Errorf("zklock: root: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultConnectTimeout)
	defer cancel()
	if err := d.checkPerms(ctx); err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	d.start()
	return d, nil
}

// negotiatedTimeout reads the session timeout that conn negotiated, which
// the zk package keeps unexported. It reads it only once the connection has
// a session (the state is stored atomically after the timeout).
func negotiatedTimeout(conn *zk.Conn) time.Duration {
	if conn.State() != zk.StateHasSession {
		return 0
	}
	f := reflect.ValueOf(conn).Elem().FieldByName("sessionTimeoutMs")
	if !f.IsValid() || f.Kind() != reflect.Int32 {
		return 0
	}
	return time.Duration(f.Int()) * time.Millisecond
}

func newDriver(cfg config) *Driver {
	return &Driver{
		root:    cfg.root,
		acl:     cfg.acl,
		log:     cfg.logger,
		holds:   map[string]*held{},
		parents: map[string]struct{}{},
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		resumed: make(chan struct{}, 1),
	}
}

func (d *Driver) start() {
	d.spawn(d.monitor)
	d.spawn(d.pinger)
}

// waitSession waits until conn has a session.
func waitSession(ctx context.Context, conn *zk.Conn) error {
	return waitSessionOr(ctx, conn, func() error { return nil })
}

// waitSessionOr waits until conn has a session, or until refused reports
// a failure no retry cures.
func waitSessionOr(ctx context.Context, conn *zk.Conn, refused func() error) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for conn.State() != zk.StateHasSession {
		if err := refused(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no session: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
	return nil
}

// Conn returns the driver's ZooKeeper connection.
func (d *Driver) Conn() *zk.Conn { return d.conn }

// SessionTTL is the negotiated session timeout: how long the server keeps
// the session, and so every lock of this driver, after its last contact
// with the driver.
func (d *Driver) SessionTTL() time.Duration { return d.ttl }

// spawn runs f in a goroutine that Close waits for, unless the driver is
// closed.
func (d *Driver) spawn(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
	return true
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// poke wakes the monitor; it never blocks (the zk client calls it).
func (d *Driver) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// closeLimit bounds Close, connection dead or alive.
const closeLimit = 2 * time.Second

// Close ends the driver: a connection it opened is closed, which ends its
// session and so frees its locks at once; on a connection the caller
// passed, it deletes the nodes of its locks. It returns within two
// seconds, connection dead or alive. On a connection it opened, no
// goroutine of the driver or of the zk client is left when it returns; on
// the caller's connection, calls it cannot interrupt end with the zk
// client's own timeouts. Later calls return ErrClosed.
func (d *Driver) Close() error {
	start := time.Now()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("zklock: close: %w", backend.ErrClosed)
	}
	d.closed = true
	d.shut.Store(true)
	holds := d.holds
	d.holds = map[string]*held{}
	d.mu.Unlock()
	close(d.done)
	if d.own {
		d.closeConn()
		if !waitTimeout(&d.wg, closeLimit-time.Since(start)) {
			d.log.Debug("zklock: close: a call of the driver is still running")
		}
		return nil
	}
	// The caller's connection lives on: delete our nodes, briefly.
	var wg sync.WaitGroup
	for _, h := range holds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = d.conn.Delete(h.path, -1)
		}()
	}
	waitTimeout(&wg, closeLimit/2)
	if !waitTimeout(&d.wg, closeLimit-100*time.Millisecond-time.Since(start)) {
		d.log.Debug("zklock: close: a call on the connection is still running")
	}
	return nil
}

// closeConn closes the driver's own connection within closeLimit. The zk
// client sends a close request, which ends the session at once, and waits
// up to a second for the answer (up to three when requests are queued);
// it then stops only once its connection fails, which takes up to two
// thirds of the session timeout on a dead one. So: a second for the
// polite close, then cut the connections and refuse new ones.
func (d *Driver) closeConn() {
	start := time.Now()
	polite := make(chan struct{})
	go func() {
		defer close(polite)
		d.conn.Close()
	}()
	wait := closeLimit / 2
	if d.conn.SessionID() == 0 {
		// No session (the server never answered): nothing to close
		// politely, and the zk client would wait a second for it.
		wait = 0
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-polite:
	case <-t.C:
	}
	d.hosts.stop()
	d.dialed.cut()
	d.drainEvents(closeLimit - 100*time.Millisecond - time.Since(start))
	t.Reset(max(closeLimit-100*time.Millisecond-time.Since(start), 0))
	select {
	case <-polite:
	case <-t.C:
		d.log.Debug("zklock: the zk client is still sending its close request")
	}
}

// drainEvents waits, bounded, until the zk client's goroutines end.
func (d *Driver) drainEvents(limit time.Duration) {
	t := time.NewTimer(max(limit, 0))
	defer t.Stop()
	for {
		select {
		case _, ok := <-d.events:
			if !ok {
				return
			}
		case <-t.C:
			d.log.Debug("zklock: the zk client is still stopping")
			return
		}
	}
}

// waitTimeout waits for wg, at most limit; false if it gave up.
func waitTimeout(wg *sync.WaitGroup, limit time.Duration) bool {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	t := time.NewTimer(max(limit, 0))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// zkLogger sends the zk client's messages to slog at debug level.
type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	if z.l.Enabled(context.Background(), slog.LevelDebug) {
		z.l.Debug("zk: " + fmt.Sprintf(format, args...))
	}
}

// hostList is the zk client's server list without its pause on the first
// reconnections: the default provider waits a second before every retry
// on a single server, which delays the news of an expired session (one
// connection to learn it, another for the new session). This one goes
// twice around the servers at once, then pauses between rounds.
type hostList struct {
	mu      sync.Mutex
	servers []string
	curr    int
	tried   int
	stopped bool
}

// stop makes every later Next a "retry start", where the zk client checks
// whether it was told to close.
func (h *hostList) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
}

func (h *hostList) Init(servers []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.servers = append([]string(nil), servers...)
	h.curr = -1
	return nil
}

func (h *hostList) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.servers)
}

func (h *hostList) Next() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.servers)
	h.curr = (h.curr + 1) % n
	h.tried++
	return h.servers[h.curr], h.stopped || h.tried > 2*n && (h.tried-1)%n == 0
}

func (h *hostList) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tried = 0
}
