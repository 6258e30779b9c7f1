package zklock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
)

// ErrSessionExpired is wrapped by the error of a TryAcquire, Enqueue or
// Wait (with backend.ErrRequeue) whose session expired, and its queue node
// with it, before it could tell whether it holds the lock.
var ErrSessionExpired = errors.New("zklock: session expired")

// Driver is the ZooKeeper backend: one session per Driver, one ephemeral
// sequential node per acquisition.
type Driver struct {
	conn   *zk.Conn
	own    bool            // the driver opened conn and closes it
	events <-chan zk.Event // own connections: closed when conn's goroutines end
	dialed *dialed         // own connections: what Close cuts
	hosts  *hostList       // own connections
	root   string
	acl    []zk.ACL
	digest string        // with WithDigestAuth: our digest id, "user:hash"
	ttl    time.Duration // the negotiated session timeout
	log    *slog.Logger

	pmu     sync.Mutex
	parents map[string]struct{} // names' nodes seen to exist (the server deletes them when empty)

	gate    backend.Gate    // the calls: ErrClosed after Close, their contexts end when it begins
	done    <-chan struct{} // the gate's: closed when Close begins
	mu      sync.Mutex
	stopped bool             // no more background work: Close waits for it, bounded
	holds   map[string]*held // by token
	watches watchQueue       // holds to watch for theft (theft.go)
	wg      sync.WaitGroup   // goroutines the driver started
	wake    chan struct{}    // session events for the monitor

	last    atomic.Pointer[contact] // the latest answered request
	resumed chan struct{}           // a session again: ping now
	since   atomic.Int64            // own connections: when the zk client last had a session again (UnixNano), 0 while it has none

	tries atomic.Uint64 // storeTries

	testHookWatch     func() // tests: called before a waiter watches its predecessor
	testHookHeldWatch func() // tests: called before the theft watch of a held node is set
	testNoInline      bool   // tests: every call on a goroutine of its own, as before calls ran inline
	testNoMarker      bool   // tests (broken): acquisitions leave no delay marker
}

var (
	_ backend.Driver      = (*Driver)(nil)
	_ backend.Queuer      = (*Driver)(nil)
	_ backend.Session     = (*Driver)(nil)
	_ backend.Delayer     = (*Driver)(nil)
	_ backend.SetAcquirer = (*Driver)(nil)
	_ backend.Notifier    = (*Driver)(nil)
	_ backend.Modal       = (*Driver)(nil)
	_ backend.Resizer     = (*Driver)(nil)
	_ backend.Inspector   = (*Driver)(nil)
	_ backend.Lister      = (*Driver)(nil)
	_ backend.Breaker     = (*Driver)(nil)
	_ backend.Diagnoser   = (*Driver)(nil)
	_ backend.StoreClock  = (*Driver)(nil)
)

// New returns a driver that uses conn, a connection the caller built and
// authenticated (pass the ACL its nodes need with WithACL); it does not
// close conn. For conn's messages in slog, connect with
// zk.WithLogger(zklock.Logger(l)).
//
// New waits for conn's session, up to WithConnectTimeout (default 5s).
// Pass the session timeout conn negotiated with WithSessionTimeout;
// without it, New asks the server ("cons" four-letter word), and fails,
// wrapping backend.ErrUnsupported, if it does not say. The driver sees an
// expired session on conn only when it polls conn or a request finds a new
// session (see docs/backends/zklock.md, What it cannot promise).
func New(conn *zk.Conn, opts ...Option) (*Driver, error) {
	if conn == nil {
		return nil, fmt.Errorf("zklock: New: %w: nil *zk.Conn", backend.ErrInvalidOption)
	}
	cfg := defaults(append([]Option{WithSessionTimeout(0)}, opts...))
	if err := checkRoot(cfg.root); err != nil {
		return nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidOption, err)
	}
	if cfg.sessionTimeout < 0 || cfg.connectTimeout <= 0 {
		return nil, fmt.Errorf("zklock: New: %w: session timeout %v, connect timeout %v", backend.ErrInvalidOption, cfg.sessionTimeout, cfg.connectTimeout)
	}
	if cfg.acl == nil {
		cfg.acl = zk.WorldACL(zk.PermAll)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.connectTimeout)
	defer cancel()
	if err := waitSession(ctx, conn); err != nil {
		return nil, fmt.Errorf("zklock: New: the connection has %w within the connect timeout (%v)", err, cfg.connectTimeout)
	}
	d := newDriver(cfg)
	d.conn = conn
	d.ttl = cfg.sessionTimeout
	if d.ttl <= 0 {
		d.ttl = consTimeout(ctx, conn)
	}
	if d.ttl <= 0 {
		return nil, fmt.Errorf("zklock: New: the session timeout of the connection is unknown (the server does not answer the cons four-letter word); pass WithSessionTimeout: %w", backend.ErrUnsupported)
	}
	if err := d.ready(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func newDriver(cfg config) *Driver {
	d := &Driver{
		root:    cfg.root,
		acl:     cfg.acl,
		log:     cfg.logger,
		holds:   map[string]*held{},
		parents: map[string]struct{}{},
		wake:    make(chan struct{}, 1),
		resumed: make(chan struct{}, 1),
	}
	d.done = d.gate.Context().Done()
	return d
}

// ready refuses a root or permissions locking cannot use, then starts the
// driver's background work.
func (d *Driver) ready(ctx context.Context) error {
	if err := d.checkACL(d.root); err != nil {
		return fmt.Errorf("zklock: root: %w", err)
	}
	if err := d.checkPerms(ctx); err != nil {
		return fmt.Errorf("zklock: %w", err)
	}
	d.spawn(d.monitor)
	d.spawn(d.pinger)
	return nil
}

// Conn returns the driver's ZooKeeper connection.
func (d *Driver) Conn() *zk.Conn { return d.conn }

// SessionTTL is the negotiated session timeout: how long the server keeps
// the session, and every lock of this driver, after its last contact.
func (d *Driver) SessionTTL() time.Duration { return d.ttl }

// spawn runs f in a goroutine that Close waits for (bounded), unless Close
// is past that: background work (deleting a node, watching a held one) is
// no call, which the Gate would wait for without a bound.
func (d *Driver) spawn(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return false
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
	return true
}

// enter is the gate's Enter for operation op.
func (d *Driver) enter(ctx context.Context, op string) (context.Context, func(), error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, d.closedErr(op)
	}
	return ctx, done, nil
}

// closeLimit bounds Close, connection dead or alive.
const closeLimit = 2 * time.Second

// Close ends the driver: it closes a connection it opened, which ends its
// session and frees its locks at once, or deletes its locks' nodes on the
// caller's; either way it deletes the delay markers of its locks not lost,
// as Release does. It returns within two seconds, connection dead or
// alive, leaving no goroutine of the driver or its own zk client (on the
// caller's connection, calls it cannot interrupt end with the zk client's
// timeouts). Later calls return ErrClosed.
func (d *Driver) Close() error {
	start := time.Now()
	// Calls in flight return within about a round trip (see abandon).
	if !d.gate.Close() {
		return fmt.Errorf("zklock: close: %w", backend.ErrClosed)
	}
	d.mu.Lock()
	d.stopped = true
	// As by a release, with the markers of the locks not lost (a lost one
	// keeps its delay); on our own connection the nodes go with the session.
	var wg sync.WaitGroup
	for _, h := range d.holds {
		marker := h.marker
		if h.lost {
			marker = ""
		}
		if !d.own || marker != "" {
			wg.Go(func() { _ = d.deleteWith(h.path, marker, -1) })
		}
	}
	d.holds = map[string]*held{}
	for _, h := range d.watches.holds {
		h.done, h.queued = true, false
	}
	d.watches.holds = nil
	if d.watches.timer != nil && d.watches.timer.Stop() {
		d.watches.armed = false
	}
	d.mu.Unlock()
	parallel.Wait(&wg, closeLimit/2)
	limit := closeLimit - 100*time.Millisecond
	if d.own {
		d.closeConn(start, true)
		limit = closeLimit
	}
	if !parallel.Wait(&d.wg, limit-time.Since(start)) {
		d.log.Debug("zklock: close: a call of the driver is still running")
	}
	return nil
}

// TryAcquire takes l.Key if nobody holds it or waits for it: it queues a
// node and deletes it unless it holds at once. A failure that left no node
// is tried twice more: the first request after an expired session or a
// reconnection may fail where the next succeeds.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (g backend.Grant, err error) {
	bo := newBackoff()
	for try := 1; ; try++ {
		var t *ticket
		if g, t, err = d.join(ctx, l, "try-acquire", false); t != nil {
			if err == nil {
				err = fmt.Errorf("zklock: try-acquire: %w", backend.ErrNotAcquired)
			}
			d.abandon(ctx, t.e)
			return g, err
		}
		if err == nil || try == 3 || !transient(err) || !bo.Pause(ctx) {
			return g, err
		}
	}
}

// Release deletes l.Token's node if it holds l.Key.
func (d *Driver) Release(ctx context.Context, l backend.Claim) (err error) {
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "release")
	if err != nil {
		return err
	}
	defer done()
	path, marker, session, err := d.heldNode(ctx, l, d.unhold(l.Token, ""), true)
	if err != nil {
		return err
	}
	return d.deleteHeld(ctx, path, marker, session, false)
}

// deleteHeld deletes a held lock's node, and its marker if not "", for
// Release; session is the node's (0: unknown); uncertain: an earlier
// delete's answer was lost.
func (d *Driver) deleteHeld(ctx context.Context, path, marker string, session int64, uncertain bool) error {
	// The node's name is unique to the token: after an attempt whose answer
	// was lost, "no node" means that attempt deleted it.
	bo := newBackoff()
	for {
		_, err := callInline(ctx, d, func() (struct{}, error) { return struct{}{}, d.deleteWith(path, marker, -1) })
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode) && uncertain:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			return fmt.Errorf("zklock: %w", backend.ErrNotHeld)
		case session != 0 && d.conn.SessionID() != session:
			return fmt.Errorf("zklock: %w: session %#x expired", backend.ErrNotHeld, session)
		case transient(err) && ctx.Err() == nil:
			uncertain = true
			if bo.Pause(ctx) {
				continue
			}
		}
		if !transient(err) && ctx.Err() == nil {
			return fmt.Errorf("zklock: %w", err)
		}
		// Could not tell. The node lives as long as our session: keep
		// trying, or the lock would stay held.
		i := strings.LastIndexByte(path, '/')
		parent, name := path[:i], path[i+1:]
		d.spawn(func() { d.reapHash(parent, hashOf(name), session) })
		return fmt.Errorf("zklock: %w (deleting the node in the background)", d.gate.Failed(ctx, err))
	}
}

// unhold forgets token's lock, if any (of node path, unless ""): no
// watch, no loss to report.
func (d *Driver) unhold(token, path string) *held {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.holds[token]
	if h == nil || path != "" && h.path != path {
		return nil
	}
	delete(d.holds, token)
	d.unwatch(h)
	return h
}

// Refresh checks that l.Token still holds l.Key: the session keeps the lock
// alive, so there is nothing to extend.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) (err error) {
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "refresh")
	if err != nil {
		return err
	}
	defer done()
	d.mu.Lock()
	h := d.holds[l.Token]
	d.mu.Unlock()
	path, _, session, err := d.heldNode(ctx, l, h, false)
	if err != nil {
		return err
	}
	st, err := callInline(ctx, d, func() (*zk.Stat, error) {
		ok, st, err := d.conn.Exists(path)
		if !ok {
			st = nil // no node
		}
		return st, err
	})
	switch {
	case err != nil && h != nil && d.conn.SessionID() != session:
		return fmt.Errorf("zklock: %w: session %#x expired", backend.ErrNotHeld, session)
	case err != nil:
		return fmt.Errorf("zklock: %w", err)
	case st == nil:
		return fmt.Errorf("zklock: %w", backend.ErrNotHeld)
	case h != nil && st.EphemeralOwner != session:
		return fmt.Errorf("zklock: %w: the node belongs to another session", backend.ErrNotHeld)
	case l.Fence != 0 && uint64(st.Czxid) != l.Fence:
		return fmt.Errorf("zklock: %w: another incarnation", backend.ErrNotHeld)
	}
	return nil
}

// heldNode is the node by which l.Token holds l.Key, its delay marker and
// its session: h's, or else the token's node found first in the queue
// (session 0: unknown); ErrNotHeld when there is none. With drop, a node
// of the token that does not hold is deleted.
func (d *Driver) heldNode(ctx context.Context, l backend.Claim, h *held, drop bool) (string, string, int64, error) {
	if h != nil {
		if d.conn.SessionID() != h.session {
			// Its session ended, and the server deleted the node with it.
			return "", "", 0, fmt.Errorf("zklock: %w: session %#x expired", backend.ErrNotHeld, h.session)
		}
		return h.path, h.marker, h.session, nil
	}
	p, marker, first, err := d.lookup(ctx, l)
	switch {
	case err != nil:
		return "", "", 0, fmt.Errorf("zklock: %w", err)
	case p != "" && !first && drop:
		// A queue node of this token that does not hold the lock: not
		// ours to report as released, but nobody wants it either.
		_ = d.deleteWith(p, marker, -1)
	}
	if !first {
		return "", "", 0, fmt.Errorf("zklock: %w", backend.ErrNotHeld)
	}
	return p, marker, 0, nil
}
