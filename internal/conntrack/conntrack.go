// Package conntrack keeps the connections a driver's own client dialed, so
// that the driver can cut them all at Close (pgx and the zk client end
// connections politely, and on a dead network politeness waits for
// seconds) and interrupt reads that a cancelled call left blocked (go-redis
// never watches a context's cancellation). One tracked connection type
// serves both.
package conntrack

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrCut is what a dial through a Tracker returns after Cut: the driver is
// closing and its client must not reconnect.
var ErrCut = errors.New("connection tracker cut: driver closed")

// Tracker is the set of one client's live connections. The zero value is
// not usable: use New.
type Tracker struct {
	mu    sync.Mutex
	cut   bool
	conns map[*Conn]struct{}
	cuts  atomic.Int64 // reads cut by CutOnEnd
}

// New returns an empty Tracker.
func New() *Tracker { return &Tracker{conns: map[*Conn]struct{}{}} }

// Dialer returns a dial function that dials with dial (a net.Dialer's if
// nil) and tracks each connection in t.
func (t *Tracker) Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return t.Add(c)
	}
}

// Add tracks c, which was just dialed, and returns the connection to give
// the client: a *Conn, or one that also exposes c's syscall.Conn (go-redis
// and pgx peek at the socket of those). After Cut it closes c and returns
// ErrCut.
func (t *Tracker) Add(c net.Conn) (net.Conn, error) {
	tc := &Conn{Conn: c, t: t}
	t.mu.Lock()
	if t.cut {
		t.mu.Unlock()
		c.Close()
		return nil, ErrCut
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	if _, ok := c.(syscall.Conn); ok {
		return sysConn{tc}, nil
	}
	return tc, nil
}

// Cut closes every tracked connection at once and refuses new ones.
func (t *Tracker) Cut() {
	t.mu.Lock()
	t.cut = true
	conns := t.conns
	t.conns = map[*Conn]struct{}{}
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

// Len is how many connections are open.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// Read is a read in progress: its connection and its number.
type Read struct {
	c *Conn
	n uint64
}

// Reading returns the reads in progress now.
func (t *Tracker) Reading() []Read {
	var rs []Read
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		if n := c.reads.Load(); n&1 == 1 {
			rs = append(rs, Read{c, n})
		}
	}
	return rs
}

// Interrupt ends r if it is still blocked and has a read deadline (a read
// with none, such as pub/sub's wait for messages, is left alone), and
// reports whether it did. The client sees a timeout.
func (r Read) Interrupt() bool {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reads.Load() != r.n || !c.bounded {
		return false
	}
	_ = c.Conn.SetReadDeadline(time.Now())
	return true
}

// Conn is a tracked connection. It counts its reads (two atomic adds per
// Read, no allocation) so that a blocked one can be told from a new one.
type Conn struct {
	net.Conn
	t     *Tracker
	reads atomic.Uint64 // odd while a Read is in progress

	// mu orders the client's read deadlines with Interrupt's: the deadline
	// of a new read is never overwritten by the cut of the previous one.
	mu      sync.Mutex
	bounded bool // a read deadline is set
}

func (c *Conn) Read(b []byte) (int, error) {
	c.reads.Add(1)
	n, err := c.Conn.Read(b)
	c.reads.Add(1)
	return n, err
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bounded = !t.IsZero()
	return c.Conn.SetReadDeadline(t)
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bounded = !t.IsZero()
	return c.Conn.SetDeadline(t)
}

// Close closes the connection and forgets it.
func (c *Conn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}

// NetConn returns the wrapped connection, as tls.Conn's does: client
// libraries unwrap connections this way to reach the socket.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// sysConn is a Conn over a syscall.Conn (TCP, Unix), which it exposes.
type sysConn struct{ *Conn }

func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.Conn.(syscall.Conn).SyscallConn()
}
