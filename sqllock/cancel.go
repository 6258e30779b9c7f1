package sqllock

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cancelWait bounds how long a cancelled statement's answer is awaited
// before its connection is closed (a dead network); within
// backend.CancelGrace.
const cancelWait = 100 * time.Millisecond

// cancelOnServer makes the server cancel the pool's statements whose
// context ends, and still reads their answer for up to cancelWait, where
// pgx's default closes the connection at once: the server may then commit
// an acquisition nobody waits for, held for its TTL. A connection sent a
// cancel is not used again (PrepareConn refuses it), since a late cancel
// would stop its next statement. Why not AfterRelease, and the rest, is in
// docs/backends/sqllock.md (Cancelled statements and Close).
func cancelOnServer(cfg *pgxpool.Config) {
	var spoiled sync.Map // *pgconn.PgConn → struct{}
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &serverCancel{conn: c, spoiled: &spoiled}
	}
	prepare := cfg.PrepareConn
	if prepare == nil && cfg.BeforeAcquire != nil {
		before := cfg.BeforeAcquire
		prepare = func(ctx context.Context, c *pgx.Conn) (bool, error) { return before(ctx, c), nil }
	}
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if _, bad := spoiled.LoadAndDelete(c.PgConn()); bad {
			return false, nil
		}
		if prepare == nil {
			return true, nil
		}
		return prepare(ctx, c)
	}
	before := cfg.BeforeClose
	cfg.BeforeClose = func(c *pgx.Conn) {
		spoiled.Delete(c.PgConn())
		if before != nil {
			before(c)
		}
	}
}

// serverCancel is a ctxwatch.Handler: see cancelOnServer.
type serverCancel struct {
	conn    *pgconn.PgConn
	spoiled *sync.Map
	stop    context.CancelFunc
	sent    chan struct{}
}

func (h *serverCancel) HandleCancel(context.Context) {
	deadline := time.Now().Add(cancelWait)
	h.conn.Conn().SetDeadline(deadline)
	ctx, stop := context.WithDeadline(context.Background(), deadline)
	h.stop, h.sent = stop, make(chan struct{})
	go func() {
		defer close(h.sent)
		_ = h.conn.CancelRequest(ctx)
	}()
}

func (h *serverCancel) HandleUnwatchAfterCancel() {
	h.stop() // a cancel not sent yet is not sent
	<-h.sent
	h.spoiled.Store(h.conn, struct{}{})
	h.conn.Conn().SetDeadline(time.Time{})
}
