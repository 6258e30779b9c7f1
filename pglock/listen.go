package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
	"github.com/lockerhq/locker/internal/retry"
)

// Subscribe implements backend.Notifier: one connection per driver
// LISTENs for every subscriber, and a subscription makes its key present
// (presence.go), so that its releases notify. When that connection breaks,
// the driver reconnects and wakes every subscriber, since releases may
// have gone unheard meanwhile.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	cctx, done, err := d.begin(ctx, "subscribe", false)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	ch, cancel, err := d.lis.subscribe(cctx, notifyPayload(d.notifySecret, key))
	if err != nil {
		return nil, nil, err
	}
	// Listening, then present: a release from now on notifies.
	drop, ok := d.presence.hold(cctx, key)
	if !ok {
		drop()
		cancel()
		if cctx.Err() != nil {
			return nil, nil, fmt.Errorf("pglock: subscribe: %w", context.Cause(cctx))
		}
		return nil, nil, fmt.Errorf("pglock: subscribe: no connection to announce the wait on")
	}
	return ch, sync.OnceFunc(func() { drop(); cancel() }), nil
}

// subscribeWait bounds how long Subscribe waits for the listening
// connection; the caller then polls instead.
const subscribeWait = 5 * time.Second

// listenPing is how long the listener waits without a notification before
// it checks its connection, and listenPingWait how long the check may take:
// a connection that went silent without breaking (a partition, a half-open
// TCP connection) would otherwise swallow notifications unseen, and only a
// connection seen broken is replaced, with every subscriber woken.
const (
	listenPing     = time.Second
	listenPingWait = 2 * time.Second
)

type subscription struct {
	key string // the payload that announces its key's release
	ch  chan struct{}
}

func (s *subscription) wake() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// listener owns the driver's one LISTEN connection. It starts with the
// first subscriber and stops ListenIdle after the last one left.
type listener struct {
	d      *Driver
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// socks tracks the listening connections when the pool is the
	// caller's (the driver's own pool tracks them already), so that close
	// cuts them: pgx closes a broken connection in the background, with a
	// cancel request and a drain of up to 15 s each on a dead network.
	socks *conntrack.Tracker

	mu        sync.Mutex
	closed    bool
	subs      map[string]map[*subscription]struct{} // by payload; no empty set
	idleSince time.Time
	running   bool          // a goroutine runs (or is about to run) the connection
	ready     chan struct{} // closed while LISTEN is in effect
	lastErr   error         // why the last connection attempt failed, until one succeeds
}

func newListener(d *Driver) *listener {
	l := &listener{d: d, subs: map[string]map[*subscription]struct{}{}, socks: conntrack.New()}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

func (l *listener) subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	s := &subscription{key: key, ch: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, fmt.Errorf("pglock: subscribe: %w", backend.ErrClosed)
	}
	set := l.subs[key]
	if set == nil {
		set = map[*subscription]struct{}{}
		l.subs[key] = set
	}
	set[s] = struct{}{}
	if !l.running {
		l.running = true
		l.lastErr = nil
		l.ready = make(chan struct{})
		l.wg.Add(1)
		go l.run()
	}
	ready, lastErr := l.ready, l.lastErr
	l.mu.Unlock()

	cancel := sync.OnceFunc(func() { l.remove(s) })
	select {
	case <-ready:
		return s.ch, cancel, nil
	default:
	}
	if lastErr != nil {
		// The connection is down and reconnecting: let the caller poll
		// rather than wait.
		cancel()
		return nil, nil, fmt.Errorf("pglock: subscribe: listener reconnecting: %w", lastErr)
	}
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
		return s.ch, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("pglock: subscribe: %w", context.Cause(ctx))
	case <-l.ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("pglock: subscribe: %w", backend.ErrClosed)
	case <-t.C:
		cancel()
		return nil, nil, fmt.Errorf("pglock: subscribe: no listening connection after %v", subscribeWait)
	}
}

func (l *listener) remove(s *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.subs[s.key]
	if _, ok := set[s]; !ok {
		return
	}
	delete(set, s)
	if len(set) == 0 {
		delete(l.subs, s.key)
		if len(l.subs) == 0 {
			l.idleSince = time.Now()
		}
	}
}

func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.socks.Cut()
	l.wg.Wait()
}

// wakeAll wakes every subscriber.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakeAllLocked()
}

// wakeAllLocked wakes every subscriber; l.mu is held.
func (l *listener) wakeAllLocked() {
	for _, set := range l.subs {
		for s := range set {
			s.wake()
		}
	}
}

func (l *listener) deliver(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[payload] {
		s.wake()
	}
}

// stopIfIdle ends the goroutine when nobody is subscribed (for at least
// idle), deciding under l.mu so that a concurrent subscribe starts a new one.
func (l *listener) stopIfIdle(idle time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() == nil && (len(l.subs) > 0 || time.Since(l.idleSince) < idle) {
		return false
	}
	l.running = false
	return true
}

func (l *listener) run() {
	defer l.wg.Done()
	bo := retry.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}
	for {
		conn, err := l.connect()
		if err != nil {
			l.mu.Lock()
			l.lastErr = err
			l.mu.Unlock()
			if l.stopIfIdle(0) {
				return
			}
			_ = retry.Sleep(l.ctx, bo.Next())
			continue
		}
		bo.Reset()
		l.mu.Lock()
		l.lastErr = nil
		close(l.ready)
		l.wakeAllLocked() // releases may have passed unheard while we connected
		l.mu.Unlock()

		stopped := l.serve(conn)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if stopped {
			return
		}
		l.mu.Lock()
		l.ready = make(chan struct{})
		l.wakeAllLocked()
		l.mu.Unlock()
	}
}

// serve delivers notifications until the connection breaks (false) or the
// listener stops (true).
func (l *listener) serve(conn *pgx.Conn) bool {
	tick := min(max(l.d.cfg.listenIdle/2, 10*time.Millisecond), time.Second)
	heard := time.Now()
	for {
		wctx, cancel := context.WithTimeout(l.ctx, tick)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if n != nil {
			heard = time.Now()
			l.deliver(n.Payload)
		}
		switch {
		case err == nil:
		case l.ctx.Err() != nil:
			return l.stopIfIdle(0)
		case (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) && !conn.IsClosed():
			if l.stopIfIdle(l.d.cfg.listenIdle) {
				return true
			}
			if time.Since(heard) >= listenPing {
				// A connection that died without a word (a half-open TCP
				// connection) would otherwise wait forever.
				pctx, cancel := context.WithTimeout(l.ctx, listenPingWait)
				err := conn.Ping(pctx)
				cancel()
				if err != nil {
					return l.ctx.Err() != nil && l.stopIfIdle(0)
				}
				heard = time.Now()
			}
		default:
			return false
		}
	}
}

// connect opens the listening connection.
func (l *listener) connect() (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	defer cancel()
	conn, err := l.d.connectOutside(ctx, l.socks)
	if err == nil {
		_, err = conn.Exec(ctx, l.d.sql.listen)
		if err != nil {
			_ = conn.Close(context.Background())
		}
	}
	return conn, err
}

// connectOutside opens a connection with the pool's configuration and
// hooks, outside the pool so that it takes none of its connections, its
// socket tracked in socks.
func (d *Driver) connectOutside(ctx context.Context, socks *conntrack.Tracker) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pc := d.pool.Config()
	cc := pc.ConnConfig // a copy, as pc is
	cc.DialFunc = trackDial(socks, cc.DialFunc)
	if cc.BuildContextWatcherHandler != nil {
		// Its waits are cancelled as a matter of course: no
		// CancelRequest for them (cancelOnServer is for the pool's).
		cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
		}
	}
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, cc); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if pc.AfterConnect != nil {
		if err := pc.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}
