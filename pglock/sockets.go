package pglock

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sockets tracks every connection that a pool the driver opened dials, so
// that Close can cut them all at once. pgx ends connections politely, and
// on a dead network politeness waits: a pooled connection is closed with
// Terminate and a read until the server hangs up, and one interrupted
// mid-query first sends a CancelRequest over a new connection, each for up
// to 15 seconds, and the pool's Close waits for all of it.
type sockets struct {
	mu     sync.Mutex
	open   map[*socket]struct{}
	closed bool
}

var errDriverClosed = errors.New("pglock: driver closed")

// track makes cfg's connections (those of the pool and of the listener,
// which copies the pool's configuration) dial through s.
func track(cfg *pgxpool.Config) *sockets {
	s := newSockets()
	cfg.ConnConfig.DialFunc = s.wrap(cfg.ConnConfig.DialFunc)
	return s
}

func newSockets() *sockets { return &sockets{open: map[*socket]struct{}{}} }

// wrap returns a dial function that dials with dial (the default dialer if
// nil) and tracks the connection in s.
func (s *sockets) wrap(dial pgconn.DialFunc) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := &socket{Conn: c, s: s}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			c.Close()
			return nil, errDriverClosed
		}
		s.open[sc] = struct{}{}
		return sc, nil
	}
}

// closeAll cuts every tracked connection and refuses new ones.
func (s *sockets) closeAll() {
	s.mu.Lock()
	s.closed = true
	open := s.open
	s.open = map[*socket]struct{}{}
	s.mu.Unlock()
	for sc := range open {
		sc.Conn.Close()
	}
}

type socket struct {
	net.Conn
	s *sockets
}

func (sc *socket) Close() error {
	sc.s.mu.Lock()
	delete(sc.s.open, sc)
	sc.s.mu.Unlock()
	return sc.Conn.Close()
}
