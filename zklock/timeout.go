package zklock

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// go-zookeeper keeps the negotiated session timeout to itself: see
// docs/backends/zklock.md, Learning the session timeout.

// handshake keeps the timeout the zk client logs after each handshake.
type handshake struct {
	ms   atomic.Int32
	once sync.Once
	seen chan struct{} // closed at the first report
}

func newHandshake() *handshake { return &handshake{seen: make(chan struct{})} }

// Logger returns a zk.Logger that sends go-zookeeper's messages to l at
// debug level, for a connection made by the caller (see New):
// zk.Connect(servers, timeout, zk.WithLogger(zklock.Logger(l))).
func Logger(l *slog.Logger) zk.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return zkLogger{l: l}
}

// zkLogger sends the zk client's messages to slog at debug level, and
// notes the session timeout in its report of a handshake.
type zkLogger struct {
	l  *slog.Logger
	hs *handshake // nil: nothing to note
}

func (z zkLogger) Printf(format string, args ...any) {
	if z.hs != nil && strings.HasPrefix(format, "authenticated:") && strings.Contains(format, "timeout=") && len(args) > 0 {
		if ms, ok := args[len(args)-1].(int32); ok && ms > 0 {
			z.hs.ms.Store(ms)
			z.hs.once.Do(func() { close(z.hs.seen) })
		}
	}
	if z.l.Enabled(context.Background(), slog.LevelDebug) {
		z.l.Debug("zk: " + fmt.Sprintf(format, args...))
	}
}

// reported waits, within ctx and limit, for the handshake's report; 0 if
// none came.
func (h *handshake) reported(ctx context.Context, limit time.Duration) time.Duration {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-h.seen:
	case <-t.C:
	case <-ctx.Done():
	}
	return time.Duration(h.ms.Load()) * time.Millisecond
}

// consTimeout asks conn's server for its session's timeout with the "cons"
// four-letter word; 0 if it does not say (not allowed, TLS, not listed).
func consTimeout(ctx context.Context, conn *zk.Conn) time.Duration {
	sid, server := conn.SessionID(), conn.Server()
	if sid == 0 || server == "" {
		return 0
	}
	limit := time.Second
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	if limit <= 0 {
		return 0
	}
	res, _ := zk.FLWCons([]string{server}, limit)
	for _, sc := range res {
		if sc == nil {
			continue
		}
		for _, c := range sc.Clients {
			if c != nil && c.SessionID == sid && c.Timeout > 0 {
				return time.Duration(c.Timeout) * time.Millisecond
			}
		}
	}
	return 0
}

// waitSession waits until conn has a session.
func waitSession(ctx context.Context, conn *zk.Conn) error {
	return waitSessionOr(ctx, conn, func() error { return nil })
}

// waitSessionOr waits until conn has a session, or until refused reports
// a failure no retry cures.
func waitSessionOr(ctx context.Context, conn *zk.Conn, refused func() error) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for conn.State() != zk.StateHasSession {
		if err := refused(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no session: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
	return nil
}
