package zklock

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/internal/conntrack"
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
	conns  *conntrack.Tracker
}

func newDialed() *dialed {
	ctx, cancel := context.WithCancel(context.Background())
	return &dialed{ctx: ctx, cancel: cancel, conns: conntrack.New()}
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
		tc, err := t.conns.Add(c)
		if errors.Is(err, conntrack.ErrCut) {
			return nil, errDialClosed
		}
		return tc, err
	}
}

// cut closes every connection and refuses new ones.
func (t *dialed) cut() {
	t.cancel()
	t.conns.Cut()
}
