package sqllock

import (
	"context"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockerhq/locker/internal/conntrack"
)

// The driver tracks every connection that a pool it opened dials, so that
// Close can cut them all at once: pgx ends connections politely, which on a
// dead network waits up to 15 seconds a connection (see
// docs/backends/sqllock.md, Cancelled statements and Close).

// trackDial returns a dial function that dials with dial (the default
// dialer if nil) and tracks the connection in t.
func trackDial(t *conntrack.Tracker, dial pgconn.DialFunc) pgconn.DialFunc {
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
