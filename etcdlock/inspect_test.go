package etcdlock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestInspectQueueAndBreakWaiter: Break under a waiter's fence (the
// creation revision of an entry that does not hold the lock) changes
// nothing; the queue lists owners next first.
func TestInspectQueueAndBreakWaiter(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, d := h.client(t)
	key := backend.Key("t", "q")
	l, err := c1.TryAcquire(ctx, "q", locker.Owner("holder"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	for i, owner := range []string{"w1", "w2"} {
		c, _ := h.client(t)
		wg.Go(func() {
			if w, err := c.Acquire(wctx, "q", locker.Owner(owner)); err == nil {
				w.Release(ctx)
			}
		})
		// One at a time, so that the queue's order is known.
		for deadline := time.Now().Add(5 * time.Second); ; {
			if n, _ := h.Entries(ctx, key); n == i+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiter %s did not queue", owner)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	st, err := d.Inspect(ctx, key, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Owner != "holder" || st.Fence != l.Fence() || st.Waiters != 2 || strings.Join(st.Queue, ",") != "w1,w2" || st.Known != known {
		t.Fatalf("Inspect = %+v", st)
	}
	resp, err := h.admin.Get(ctx, h.probe.Dir(key), clientv3.WithLastCreate()...)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the last waiter's entry: %v", err)
	}
	if _, err := d.Break(ctx, key, backend.Exclusive, uint64(resp.Kvs[0].CreateRevision)); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Break under a waiter's fence = %v, want ErrNotHeld", err)
	}
	if n, _ := h.Entries(ctx, key); n != 3 {
		t.Fatalf("%d entries after a refused Break, want 3", n)
	}
	notLostYet(t, l)
}

func notLostYet(t *testing.T, l *locker.Lock) {
	t.Helper()
	select {
	case <-l.Lost():
		t.Fatalf("lock lost: %v", l.Err())
	default:
	}
}

// recorder is a slog.Handler that keeps what it is given.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// find returns the first record at level whose message contains msg.
func (r *recorder) find(level slog.Level, msg string) (slog.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Level == level && strings.Contains(rec.Message, msg) {
			return rec, true
		}
	}
	return slog.Record{}, false
}

// TestClientLogsReachLogger: the etcd client's messages reach the logger
// given to locker.Open, at their own level, with their fields: its
// request chatter at Debug, a failed request at Warn.
func TestClientLogsReachLogger(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	rec := &recorder{}
	c, err := locker.Open(ctx, h.url(), locker.WithLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "logged")
	if err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
	r, ok := rec.find(slog.LevelDebug, "retrying of unary invoker")
	if !ok {
		t.Fatal("no Debug record of the etcd client's requests")
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if attrs["method"] == "" {
		t.Errorf("the record has no method field: %v", attrs)
	}
	// A request whose context has ended fails: the client's report of the
	// attempt is at Debug, as the driver reports what becomes of it.
	d, _ := backend.As[*Driver](c.Driver())
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Client().Get(cctx, "x"); err == nil {
		t.Fatal("a Get with a cancelled context succeeded")
	}
	if _, ok := rec.find(slog.LevelDebug, attemptFailed); !ok {
		t.Error("no Debug record of the failed attempt")
	}
	if _, ok := rec.find(slog.LevelWarn, attemptFailed); ok {
		t.Error("a failed attempt logged at Warn")
	}
}

// The etcd client's levels map to slog's, fields included.
func TestZapLevels(t *testing.T) {
	rec := &recorder{}
	zl := zapLogger(slog.New(rec)).Named("etcd-client").With(zap.String("endpoint", "e1"))
	zl.Warn("lease keepalive response queue is full", zap.Int64("lease", 7))
	zl.Debug("chatter")
	zl.Error("broken", zap.Error(errors.New("boom")))
	for _, c := range []struct {
		level slog.Level
		msg   string
		attrs string
	}{
		{slog.LevelWarn, "etcd client: lease keepalive response queue is full", "endpoint=e1 lease=7 logger=etcd-client"},
		{slog.LevelDebug, "etcd client: chatter", "endpoint=e1 logger=etcd-client"},
		{slog.LevelError, "etcd client: broken", "endpoint=e1 error=boom logger=etcd-client"},
	} {
		r, ok := rec.find(c.level, c.msg)
		if !ok {
			t.Errorf("no %v record %q", c.level, c.msg)
			continue
		}
		var attrs []string
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a.Key+"="+a.Value.String()); return true })
		slices.Sort(attrs)
		if got := strings.Join(attrs, " "); got != c.attrs {
			t.Errorf("%q: attributes %q, want %q", c.msg, got, c.attrs)
		}
	}
	quiet := zapLogger(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if quiet.Core().Enabled(zapcore.DebugLevel) || !quiet.Core().Enabled(zapcore.WarnLevel) {
		t.Error("the core's levels do not follow the handler's")
	}
}
