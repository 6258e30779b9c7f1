package zklock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
	"github.com/lockerhq/locker/internal/parallel"
)

// maxSessionRequest is the longest session timeout the protocol can ask for.
const maxSessionRequest = math.MaxInt32 * time.Millisecond

// Dial connects to the servers ("host:port") and waits, within ctx and the
// connect timeout, for a session. Close closes the connection, which ends
// the session and frees its locks at once.
func Dial(ctx context.Context, servers []string, opts ...Option) (*Driver, error) {
	cfg := defaults(opts)
	if err := checkRoot(cfg.root); err != nil {
		return nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidOption, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("zklock: %w: no servers", backend.ErrInvalidOption)
	}
	if cfg.sessionTimeout <= 0 {
		return nil, fmt.Errorf("zklock: %w: session timeout %v", backend.ErrInvalidOption, cfg.sessionTimeout)
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
	hs := newHandshake()
	dctx, cancel := context.WithCancel(context.Background())
	d.dialed = &dialed{ctx: dctx, cancel: cancel, conns: conntrack.New()}
	d.hosts = &hostList{}
	tr := &trace{tls: cfg.tls, dial: d.dialed.dialer(cfg.dialer), last: map[string]error{}}
	// The server clamps it into its bounds; the protocol has int32 ms.
	cfg.sessionTimeout = min(cfg.sessionTimeout, maxSessionRequest)
	conn, events, err := zk.Connect(servers, cfg.sessionTimeout,
		zk.WithLogger(zkLogger{l: cfg.logger, hs: hs}),
		zk.WithLogInfo(true), // its report of the handshake carries the session timeout
		zk.WithDialer(tr.dialer),
		zk.WithHostProvider(d.hosts),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
				d.since.Store(time.Now().UnixNano())
				backend.Notify(d.resumed)
			} else if ev.Type == zk.EventSession {
				d.since.Store(0)
			}
			d.nodeEvent(ev)
			backend.Notify(d.wake)
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
		d.closeConn(time.Now(), false)
		return nil, err
	}
	if err := waitSessionOr(wctx, conn, func() error { return tr.refused(len(servers)) }); err != nil {
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
	d.ttl = hs.reported(wctx, 250*time.Millisecond)
	if d.ttl <= 0 {
		d.ttl = consTimeout(wctx, conn)
	}
	if d.ttl <= 0 {
		d.ttl = cfg.sessionTimeout
		d.log.Debug("zklock: the negotiated session timeout is unknown; assuming the one asked for", "timeout", d.ttl)
	}
	if d.ttl < cfg.sessionTimeout {
		// Lock.TTL still reports the longer TTL asked for, which a live
		// holder keeps; a crashed one keeps others out only this long.
		d.log.Warn("zklock: the server cut the session timeout asked for to its maximum: a crashed holder's locks go sooner", "asked", cfg.sessionTimeout, "granted", d.ttl)
	}
	if err := d.ready(wctx); err != nil {
		return fail(err)
	}
	return d, nil
}

// closeConn closes the driver's own connection within closeLimit of
// start: a second for the zk client's polite close (which ends the session
// at once), then a cut, or it would wait up to two thirds of the session
// timeout on a dead connection. A failed Dial with no session does not
// wait for the zk client's Close, whose answer may never come.
func (d *Driver) closeConn(start time.Time, waitNoSession bool) {
	polite := make(chan struct{})
	go func() {
		defer close(polite)
		d.conn.Close()
	}()
	wait := min(closeLimit/2, closeLimit-200*time.Millisecond-time.Since(start))
	if d.conn.SessionID() == 0 {
		// No session: nothing to close politely.
		wait = 0
	}
	parallel.Within(polite, wait)
	d.hosts.stop()
	d.dialed.cut()
	d.drainEvents(closeLimit - 100*time.Millisecond - time.Since(start))
	if !waitNoSession && d.conn.SessionID() == 0 {
		return
	}
	if !parallel.Within(polite, closeLimit-100*time.Millisecond-time.Since(start)) {
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

// hostList is the zk client's server list without the default's second of
// pause before every retry on a single server, which delays the news of
// an expired session: it goes twice around the servers at once, then
// pauses between rounds.
type hostList struct {
	mu      sync.Mutex
	servers []string
	curr    int
	tried   int
	stopped bool
}

// stop makes every later Next a "retry start", where the zk client sees
// that it was told to close.
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

// dialed keeps the connections the driver's own zk client dialed, for
// Close to cut: told to close, the zk client still waits for a dead
// server's answer up to its read timeout (ten times that while connecting).
type dialed struct {
	ctx    context.Context // ends dials in progress
	cancel context.CancelFunc
	conns  *conntrack.Tracker
}

// dialer wraps dial, or a dialer that Close can interrupt when dial is nil.
func (t *dialed) dialer(dial zk.Dialer) zk.Dialer {
	if dial == nil {
		dial = func(network, addr string, timeout time.Duration) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			return d.DialContext(t.ctx, network, addr)
		}
	}
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		if t.ctx.Err() != nil {
			return nil, conntrack.ErrCut // the zk client must not reconnect
		}
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return t.conns.Add(c)
	}
}

// cut closes every connection and refuses new ones.
func (t *dialed) cut() {
	t.cancel()
	t.conns.Cut()
}
