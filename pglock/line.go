package pglock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/internal/conntrack"
)

// The line: the first local waiters of a lock, one per process, queue in
// PostgreSQL's lock manager (an advisory lock per key, exclusive, held in
// a transaction on a connection of the driver's own, taken in arrival
// order) to be the one that tries at the next release notification. The
// others defer to it: their tries check that nobody holds the line's lock
// (a shared try of it in the acquire statement), and so does a new
// arrival's. So a release is contested by one waiter, and the processes
// take turns. The line decides only who tries: a grant is still the
// acquire statement, whose row alone makes the lock. A waiter without a
// place (the driver's connections for the line all taken, its connection
// broken) tries at every notification; one behind a first in line that is
// stuck (its process frozen, its connection half open) tries at a slow
// timer, without the check; a connection that closes releases its place.
// TryAcquire does not check the line. Two keys whose hashes collide share
// a line, which delays, no more.

// maxLineConns bounds the connections a driver keeps for the line (each
// waits for one key); waiters beyond them try at every notification.
const maxLineConns = 4

// lines are a driver's connections for the line, outside its pool, so
// that waiting never takes a connection a release needs.
type lines struct {
	d      *Driver
	mu     sync.Mutex
	closed bool
	idle   []*lineConn
	open   map[*lineConn]struct{}
}

type lineConn struct {
	conn  *pgx.Conn
	socks *conntrack.Tracker // its socket alone, cut to end a blocked wait
	since time.Time          // idle since
	timer *time.Timer        // closes it once idle for ListenIdle
}

// place is one waiter's place in the line.
type place struct {
	l      *lines
	ctx    context.Context
	cancel context.CancelFunc
	got    chan struct{} // closed when the waiter is first in line
	done   chan struct{} // closed when the waiting goroutine ended
	lc     *lineConn     // its conn is set by wait, read by others after done
	mu     sync.Mutex
	ok     bool // first in line: the advisory lock is held
}

// join starts waiting in key's line. It returns nil when no connection is
// free for it.
func (ls *lines) join(key string) *place {
	lc, dial := ls.take()
	if lc == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ls.d.gate.Context())
	p := &place{l: ls, ctx: ctx, cancel: cancel, got: make(chan struct{}), done: make(chan struct{}), lc: lc}
	go p.wait(key, dial)
	return p
}

// take returns an idle connection, or a new one to dial (dial true), or
// nothing when all are taken.
func (ls *lines) take() (*lineConn, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil, false
	}
	now := time.Now()
	for len(ls.idle) > 0 {
		lc := ls.idle[len(ls.idle)-1]
		ls.idle = ls.idle[:len(ls.idle)-1]
		lc.timer.Stop()
		if now.Sub(lc.since) < ls.d.cfg.listenIdle {
			return lc, false
		}
		delete(ls.open, lc)
		go lc.close() // idle too long: the server may have dropped it
	}
	if len(ls.open) >= maxLineConns {
		return nil, false
	}
	if ls.open == nil {
		ls.open = map[*lineConn]struct{}{}
	}
	lc := &lineConn{socks: conntrack.New()} // reserves the slot; wait dials it
	ls.open[lc] = struct{}{}
	return lc, true
}

func (p *place) wait(key string, dial bool) {
	defer close(p.done)
	lc := p.lc
	if dial {
		conn, err := p.l.d.connectOutside(p.ctx, lc.socks)
		if err != nil {
			return
		}
		lc.conn = conn // read by others only after done
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(p.l.d.sql.lineLock, p.l.d.sql.lineClass, key)
	if err := lc.conn.SendBatch(p.ctx, b).Close(); err != nil {
		return
	}
	p.mu.Lock()
	p.ok = true
	p.mu.Unlock()
	close(p.got)
}

// first reports whether the waiter is first in line.
func (p *place) first() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok
}

// out reports whether the waiter left the line without being first in
// it (its connection failed): it then tries at every notification.
func (p *place) out() bool {
	select {
	case <-p.done:
		return !p.first()
	default:
		return false
	}
}

// leave gives up the place: the advisory lock goes, by a ROLLBACK in the
// background when the waiter holds it (the connection is then reused),
// or by cutting the connection when its wait is still under way.
func (p *place) leave() {
	lc := p.lc
	if !p.first() {
		p.cancel()
		lc.socks.Cut()
		<-p.done
		p.l.drop(lc)
		return
	}
	<-p.done
	bctx, bdone, err := p.l.d.gate.Enter(context.Background())
	if err != nil {
		p.cancel()
		p.l.drop(lc)
		return
	}
	go func() {
		defer bdone()
		defer p.cancel()
		cctx, cancel := context.WithTimeout(bctx, 2*time.Second)
		defer cancel()
		if _, err := lc.conn.Exec(cctx, "ROLLBACK"); err != nil {
			p.l.drop(lc)
			return
		}
		p.l.put(lc)
	}()
}

func (ls *lines) put(lc *lineConn) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		go lc.close()
		return
	}
	lc.since = time.Now()
	ls.idle = append(ls.idle, lc)
	if lc.timer == nil {
		lc.timer = time.AfterFunc(ls.d.cfg.listenIdle, func() { ls.expire(lc) })
	} else {
		lc.timer.Reset(ls.d.cfg.listenIdle)
	}
}

// expire closes lc if it is still idle.
func (ls *lines) expire(lc *lineConn) {
	ls.mu.Lock()
	i := slices.Index(ls.idle, lc)
	if i < 0 {
		ls.mu.Unlock()
		return
	}
	ls.idle = slices.Delete(ls.idle, i, i+1)
	delete(ls.open, lc)
	ls.mu.Unlock()
	lc.close()
}

// drop closes lc and frees its slot.
func (ls *lines) drop(lc *lineConn) {
	ls.mu.Lock()
	delete(ls.open, lc)
	ls.mu.Unlock()
	lc.close()
}

func (lc *lineConn) close() {
	lc.socks.Cut()
	if lc.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = lc.conn.Close(ctx)
	}
}

// close closes every connection of the line; waits in progress end
// through the gate's context, which Close ended before.
func (ls *lines) close() {
	ls.mu.Lock()
	ls.closed = true
	idle := ls.idle
	ls.idle = nil
	open := ls.open
	ls.open = nil
	ls.mu.Unlock()
	for lc := range open {
		lc.socks.Cut()
	}
	for _, lc := range idle {
		lc.timer.Stop()
		lc.close()
	}
}
