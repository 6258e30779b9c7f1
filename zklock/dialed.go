package zklock

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// errDialClosed: the driver is closing; its zk client must not reconnect.
var errDialClosed = errors.New("zklock: driver closed")

// dialed keeps the connections that the zk client of a driver's own
// connection dialed, so that Close can cut them. Told to close, the zk
// client still waits for a dead server's answer for up to its read timeout
// (two thirds of the session timeout), ten times that while it connects,
// before it notices.
type dialed struct {
	ctx    context.Context // ends dials in progress
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	conns  map[*trackedConn]struct{}
}

func newDialed() *dialed {
	ctx, cancel := context.WithCancel(context.Background())
	return &dialed{ctx: ctx, cancel: cancel, conns: map[*trackedConn]struct{}{}}
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
			return nil, errDialClosed
		}
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, t: t}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return nil, errDialClosed
		}
		t.conns[tc] = struct{}{}
		t.mu.Unlock()
		return tc, nil
	}
}

// cut closes every connection and refuses new ones.
func (t *dialed) cut() {
	t.cancel()
	t.mu.Lock()
	t.closed = true
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t *dialed
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}
