package sqllock

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
// LISTENs for every subscriber, and holds a shared session-level advisory
// lock on every key that someone waits for (the key is present), so that
// its releases notify (notifyIfPresent). A new connection takes the keys'
// locks again and wakes every subscriber: releases may have gone unheard.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	cctx, done, err := d.begin(ctx, "subscribe", false)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	return d.lis.subscribe(cctx, key, d.payload(key))
}

// subscribeWait bounds how long Subscribe waits for the listening
// connection; the caller then polls instead.
const subscribeWait = 5 * time.Second

// presenceLinger is how long a key stays present after its last
// subscriber left, so that a contended key does not come and go.
const presenceLinger = time.Second

// listenPing is how long the listener waits without a notification before
// it checks its connection, and listenPingWait how long the check may take:
// a connection gone silent (a partition, a half-open TCP connection) would
// otherwise swallow notifications, since only a broken one is replaced.
const (
	listenPing     = time.Second
	listenPingWait = 2 * time.Second
)

// presentKey is a key that someone waits for, or did in presenceLinger.
type presentKey struct {
	key  string
	subs map[chan struct{}]struct{} // its subscribers' channels
	idle time.Time                  // since its last subscriber left
	held bool                       // its lock is held on the listening connection
}

func (k *presentKey) wake() {
	for ch := range k.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
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
	keys      map[string]*presentKey // by the payload of the key's releases
	subs      int                    // subscribers of every key
	idleSince time.Time              // since subs went to 0
	running   bool                   // a goroutine runs (or is about to run) the connection
	changed   chan struct{}          // closed (and replaced) when keys are taken or lost
	lastErr   error                  // why the last connection attempt failed, until one succeeds
	// dirty: a key needs its lock; interrupt ends the connection's wait
	// for notifications, so that it takes it now.
	dirty     bool
	interrupt context.CancelFunc
}

func newListener(d *Driver) *listener {
	l := &listener{d: d, keys: map[string]*presentKey{}, socks: conntrack.New(), changed: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// subscribe returns once key is present: listened for, and its lock held.
func (l *listener) subscribe(ctx context.Context, key, payload string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, fmt.Errorf("sqllock: subscribe: %w", backend.ErrClosed)
	}
	k := l.keys[payload]
	if k == nil {
		k = &presentKey{key: key, subs: map[chan struct{}]struct{}{}}
		l.keys[payload] = k
	}
	k.subs[ch] = struct{}{}
	l.subs++
	if !l.running {
		l.running = true
		l.lastErr = nil
		l.wg.Add(1)
		go l.run()
	}
	if !k.held {
		l.dirty = true
		if l.interrupt != nil {
			l.interrupt()
		}
	}
	l.mu.Unlock()

	cancel := sync.OnceFunc(func() { l.remove(k, ch) })
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	for {
		l.mu.Lock()
		held, changed, lastErr := k.held, l.changed, l.lastErr
		l.mu.Unlock()
		var err error
		switch {
		case held:
			return ch, cancel, nil
		case lastErr != nil:
			// The connection is down and reconnecting: let the caller
			// poll rather than wait.
			err = fmt.Errorf("listener reconnecting: %w", lastErr)
		default:
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				err = context.Cause(ctx)
			case <-l.ctx.Done():
				err = backend.ErrClosed
			case <-t.C:
				err = fmt.Errorf("no listening connection after %v", subscribeWait)
			}
		}
		cancel()
		return nil, nil, fmt.Errorf("sqllock: subscribe: %w", err)
	}
}

// remove ends a subscription to k, which stays in l.keys while it has
// subscribers (only sync drops keys, and only those without).
func (l *listener) remove(k *presentKey, ch chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(k.subs, ch)
	if len(k.subs) == 0 {
		k.idle = time.Now()
	}
	if l.subs--; l.subs == 0 {
		l.idleSince = time.Now()
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

// wakeAllLocked wakes every subscriber; l.mu is held.
func (l *listener) wakeAllLocked() {
	for _, k := range l.keys {
		k.wake()
	}
}

// lostLocked marks every key's lock lost with the connection, and wakes
// every subscriber, since releases may go unheard until the next one;
// l.mu is held.
func (l *listener) lostLocked() {
	for _, k := range l.keys {
		k.held = false
	}
	l.changedLocked()
	l.wakeAllLocked()
}

// changedLocked tells the subscribers that wait for their keys to look
// again; l.mu is held.
func (l *listener) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *listener) deliver(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.keys[payload]; k != nil {
		k.wake()
	}
}

// stopIfIdle ends the goroutine when nobody is subscribed (for at least
// idle), deciding under l.mu so that a concurrent subscribe starts a new one.
func (l *listener) stopIfIdle(idle time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() == nil && (l.subs > 0 || time.Since(l.idleSince) < idle) {
		return false
	}
	l.running = false
	l.lostLocked() // before a new goroutine takes them again
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
			l.changedLocked()
			l.mu.Unlock()
			if l.stopIfIdle(0) {
				return
			}
			bo.Pause(l.ctx)
			continue
		}
		bo.Reset()
		l.mu.Lock()
		l.lastErr = nil
		l.mu.Unlock()

		stopped := l.serve(conn)
		if !stopped {
			l.mu.Lock()
			l.lostLocked()
			l.mu.Unlock()
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if stopped {
			return
		}
	}
}

// serve takes the keys' locks and delivers notifications until the
// connection breaks (false) or the listener stops (true).
func (l *listener) serve(conn *pgx.Conn) bool {
	tick := min(max(l.d.cfg.listenIdle/2, 10*time.Millisecond), presenceLinger/4)
	heard := time.Now()
	for wake := true; ; wake = false {
		// The first pass wakes every subscriber, once their keys are
		// present again: releases may have passed unheard.
		if !l.sync(conn, wake) {
			return l.ctx.Err() != nil && l.stopIfIdle(0)
		}
		wctx, cancel := context.WithTimeout(l.ctx, tick)
		l.mu.Lock()
		l.interrupt = cancel
		if l.dirty {
			cancel()
		}
		l.mu.Unlock()
		n, err := conn.WaitForNotification(wctx)
		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
		cancel()
		if n != nil {
			heard = time.Now()
			l.deliver(n.Payload)
		}
		switch {
		case err == nil:
		case l.ctx.Err() != nil:
			return l.stopIfIdle(0)
		case (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && !conn.IsClosed():
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

// sync takes the lock of every key with subscribers that lacks it, and
// drops those that nobody waited for in presenceLinger; false when the
// connection failed. Keys that it takes are marked held together, and
// wake (a new connection) wakes every subscriber then.
func (l *listener) sync(conn *pgx.Conn, wake bool) bool {
	var lock, unlock []*presentKey
	l.mu.Lock()
	l.dirty = false
	for payload, k := range l.keys {
		switch {
		case len(k.subs) > 0 && !k.held:
			lock = append(lock, k)
		case len(k.subs) == 0 && time.Since(k.idle) >= presenceLinger:
			// A new subscriber makes it anew, and waits for its lock,
			// which this goroutine takes after the unlock.
			delete(l.keys, payload)
			if k.held {
				unlock = append(unlock, k)
			}
		}
	}
	l.mu.Unlock()
	for i, k := range append(unlock, lock...) {
		stmt := l.d.sql.presenceLock
		if i < len(unlock) {
			stmt = l.d.sql.presenceUnlock
		}
		ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
		_, err := conn.Exec(ctx, stmt, l.d.sql.presenceClass, k.key)
		cancel()
		if err != nil {
			return false
		}
	}
	if len(lock) == 0 && !wake {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range lock {
		k.held = true
	}
	l.changedLocked()
	if wake {
		l.wakeAllLocked()
	}
	return true
}

// connect opens the listening connection: with the pool's configuration
// and hooks, outside the pool so that it takes none of its connections,
// its socket tracked in l.socks.
func (l *listener) connect() (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	defer cancel()
	pc := l.d.pool.Config()
	cc := pc.ConnConfig // a copy, as pc is
	cc.DialFunc = l.socks.Dialer(cc.DialFunc)
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
		err = pc.AfterConnect(ctx, conn)
	}
	if err == nil {
		_, err = conn.Exec(ctx, l.d.sql.listen)
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}
