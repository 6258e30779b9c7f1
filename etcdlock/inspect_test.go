package etcdlock

import (
	"context"
	"errors"
	"fmt"
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
	l, err := c1.TryAcquire(ctx, "q", locker.Label("holder"))
	if err != nil {
		t.Fatal(err)
	}
	for i, owner := range []string{"w1", "w2"} {
		c, _ := h.client(t)
		queue(t, ctx, h, c, "q", i+2, locker.Label(owner))
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

// queue starts c's blocking Acquire of name with opts, and returns once
// name's objects have n entries, the last its own, so that the queue's
// order is known. The channel yields the lock once granted; the test's end
// cancels the wait or releases the lock if nobody took it.
func queue(t *testing.T, ctx context.Context, h *harness, c *locker.Client, name string, n int, opts ...locker.LockOption) <-chan *locker.Lock {
	t.Helper()
	got := make(chan *locker.Lock, 1)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l, err := c.Acquire(wctx, name, opts...); err == nil {
			got <- l
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		select {
		case l := <-got:
			l.Release(context.Background())
		default:
		}
	})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if m, _ := h.Entries(ctx, backend.Key("t", name)); m == n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter of %q did not queue", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestInspectHoldersAndQueues: the waiters' entries of a semaphore or a
// read-write lock, in the directory of its holders', are its queue: Inspect
// lists them next first and not as holders, and Break under a waiter's
// fence changes nothing. Break of a reader hands the read-write lock to
// the writer waiting behind it, which keeps a later reader waiting.
func TestInspectHoldersAndQueues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	ops, _ := h.client(t)
	waiter := func(name string, n int, opts ...locker.LockOption) <-chan *locker.Lock {
		c, _ := h.client(t)
		return queue(t, ctx, h, c, name, n, opts...)
	}
	// fences are the creation revisions of the entries of name's object
	// in dir, oldest first.
	fences := func(dir string) []uint64 {
		t.Helper()
		resp, err := h.admin.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		var fs []uint64
		for _, kv := range resp.Kvs {
			fs = append(fs, uint64(kv.CreateRevision))
		}
		return fs
	}
	check := func(name string, obj locker.LockOption, want string) {
		t.Helper()
		st, err := ops.Inspect(ctx, name, obj)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("limit %d; queue %d %v;", st.Limit, st.Waiters, st.Queue)
		for _, h := range st.Holders {
			got += fmt.Sprintf(" %s %d w%d %v", h.Owner, h.Fence, h.Weight, h.Write)
		}
		if got != want {
			t.Fatalf("Inspect(%q) = %s\nwant %s", name, got, want)
		}
	}
	refused := func(name string, obj locker.LockOption, fences ...uint64) {
		t.Helper()
		for _, f := range fences {
			if _, err := ops.ForceRelease(ctx, name, f, obj); !errors.Is(err, locker.ErrNotHeld) {
				t.Fatalf("ForceRelease(%q) under a waiter's fence %d = %v, want ErrNotHeld", name, f, err)
			}
		}
	}

	sem := locker.Semaphore(3)
	a, err := ops.TryAcquire(ctx, "sem", sem, locker.Permits(2), locker.Label("a"))
	if err != nil {
		t.Fatal(err)
	}
	waiter("sem", 2, sem, locker.Permits(2), locker.Label("b"))
	waiter("sem", 3, sem, locker.Label("c")) // a permit is free, but FIFO
	fs := fences(h.dirs(backend.Key("t", "sem"))[1])
	check("sem", sem, fmt.Sprintf("limit 3; queue 2 [b c]; a %d w2 false", a.Fence()))
	refused("sem", sem, fs[1], fs[2])
	if n, _ := h.Entries(ctx, backend.Key("t", "sem")); n != 3 {
		t.Fatalf("%d entries after a refused Break, want 3", n)
	}

	r1, err := ops.TryAcquire(ctx, "rw", locker.Read(), locker.Label("r1"))
	if err != nil {
		t.Fatal(err)
	}
	w := waiter("rw", 2, locker.Write(), locker.Label("w"))
	r2 := waiter("rw", 3, locker.Read(), locker.Label("r2"))
	fs = fences(h.dirs(backend.Key("t", "rw"))[2])
	check("rw", locker.Read(), fmt.Sprintf("limit 0; queue 2 [w r2]; r1 %d w1 false", r1.Fence()))
	refused("rw", locker.Write(), fs[1], fs[2])
	if _, err := ops.ForceRelease(ctx, "rw", r1.Fence(), locker.Read()); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-w:
		check("rw", locker.Write(), fmt.Sprintf("limit 0; queue 1 [r2]; w %d w1 true", l.Fence()))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not get the lock after its reader's Break")
	}
	if err := r1.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("the broken reader's Refresh = %v, want ErrNotHeld", err)
	}
	select {
	case <-r2:
	case <-time.After(5 * time.Second):
		t.Fatal("the second reader did not get the lock after the writer's release")
	}
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
