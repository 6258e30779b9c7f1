package zklock

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// Inspect lists the queue's owners, next first; Break under a waiter's
// fence (the zxid of a node that does not hold the lock) changes nothing;
// Break under the holder's deletes its node, the holder is told at once,
// and the next waiter holds the lock with a greater fence.
func TestInspectQueueAndBreak(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, ops := dial(t, servers), dial(t, servers)
	key := uniqueKey(t)
	lost := make(chan error, 1)
	c := lockFor(t, key)
	c.Owner = "holder"
	c.OnLost = func(err error) { lost <- err }
	g, err := holder.TryAcquire(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		g   backend.Grant
		err error
	}
	next := make(chan got, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for i, owner := range []string{"w1", "w2"} {
		w := dial(t, servers)
		wc := lockFor(t, key)
		wc.Owner = owner
		wg.Go(func() {
			g, err := acquire(wctx, w, wc)
			if owner == "w1" {
				next <- got{g, err}
			}
		})
		for deadline := time.Now().Add(5 * time.Second); ; { // one at a time: a known order
			nodes, _, err := ops.listing(ctx, ops.parentPath(key))
			if err == nil && len(nodes) == i+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiter %s did not queue: %v", owner, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	st, err := ops.Inspect(ctx, key, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Owner != "holder" || st.Fence != g.Fence || st.Waiters != 2 || strings.Join(st.Queue, ",") != "w1,w2" || st.Known != known {
		t.Fatalf("Inspect = %+v, want the holder (fence %d) and the queue w1,w2", st, g.Fence)
	}
	nodes, _, err := ops.listing(ctx, ops.parentPath(key))
	if err != nil {
		t.Fatal(err)
	}
	_, last, err := ops.conn.Exists(ops.parentPath(key) + "/" + nodes[2].name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Break(ctx, key, backend.Exclusive, uint64(last.Czxid)); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Break under a waiter's fence = %v, want ErrNotHeld", err)
	}
	if st2, err := ops.Inspect(ctx, key, backend.Exclusive); err != nil || st2.Fence != g.Fence || st2.Waiters != 2 {
		t.Fatalf("Inspect after a refused Break = %+v, %v", st2, err)
	}
	start := time.Now()
	if st, err = ops.Break(ctx, key, backend.Exclusive, g.Fence); err != nil || st.Owner != "holder" || st.Fence != g.Fence {
		t.Fatalf("Break = %+v, %v", st, err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, backend.ErrLost) {
			t.Errorf("OnLost(%v), want ErrLost", err)
		}
		t.Logf("the holder was told after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(2 * time.Second):
		t.Fatal("the holder was not told of the Break within 2s")
	}
	select {
	case r := <-next:
		if r.err != nil || r.g.Fence <= g.Fence {
			t.Fatalf("next holder: fence %d, %v; want a fence above %d", r.g.Fence, r.err, g.Fence)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next waiter did not get the lock")
	}
}

// recorder is a slog.Handler that keeps the messages it is given.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *recorder) has(msg string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, msg) {
			return true
		}
	}
	return false
}

// go-zookeeper's messages reach slog at Debug: a dialled connection's
// through WithLogger, the caller's own through Logger.
func TestZKClientLogsToSlog(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	dialled := &recorder{}
	dial(t, servers, WithLogger(slog.New(dialled)))
	if !dialled.has("DEBUG zk: connected to") {
		t.Errorf("Dial: the zk client's messages did not reach the logger: %q", dialled.all())
	}
	own := &recorder{}
	conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(Logger(slog.New(own))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = waitSession(ctx, conn)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !own.has("DEBUG zk: connected to") {
		t.Errorf("Logger: the zk client's messages did not reach the logger: %q", own.all())
	}
}

// A semaphore's and a read-write lock's queues hold grants and waiters:
// Inspect tells them apart as the acquisitions' own looks do (a claim is
// not overtaken by lighter ones behind it, a reader waits behind a
// waiting writer), Break under a waiter's fence changes nothing, and Break
// of a holder tells it at once and lets the next waiter in.
func TestInspectSharedQueue(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, waiter, ops := dial(t, servers), dial(t, servers), dial(t, servers)
	if _, err := ops.Inspect(ctx, uniqueKey(t), backend.Write+1); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("Inspect of no mode = %v, want ErrUnsupported", err)
	}
	for _, c := range []struct {
		m      backend.Mode
		claims []backend.Claim // the holder's, then the waiters'
		next   backend.Mode    // the first waiter's grant's
	}{
		{backend.Permit, []backend.Claim{
			{Mode: backend.Permit, Limit: 2, Owner: "a"},
			{Mode: backend.Permit, Limit: 2, Weight: 2, Owner: "b"},
			{Mode: backend.Permit, Limit: 2, Owner: "c"},
		}, backend.Permit},
		{backend.Read, []backend.Claim{
			{Mode: backend.Read, Owner: "a"},
			{Mode: backend.Write, Owner: "b"},
			{Mode: backend.Read, Owner: "c"},
		}, backend.Write},
	} {
		key := uniqueKey(t)
		for i := range c.claims {
			c.claims[i].Key, c.claims[i].Token, c.claims[i].TTL = key, newToken(t), time.Second
		}
		lost := make(chan error, 1)
		first := c.claims[0]
		first.OnLost = func(err error) { lost <- err }
		g, err := holder.TryAcquire(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan backend.Grant, 1)
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		for i, l := range c.claims[1:] {
			go func() {
				if g, err := acquire(wctx, waiter, l); err == nil && i == 0 {
					granted <- g
				}
			}()
			for deadline := time.Now().Add(5 * time.Second); sharedEntries(t, ops, l) != i+2; { // queued in order
				if time.Now().After(deadline) {
					t.Fatalf("%v: waiter %s did not queue", c.m, l.Owner)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		st, err := ops.Inspect(ctx, key, c.m)
		if err != nil {
			t.Fatal(err)
		}
		want := []backend.Holder{{Mode: c.m, Owner: "a", Fence: g.Fence, Weight: 1}}
		if !slices.Equal(st.Holders, want) || strings.Join(st.Queue, ",") != "b,c" || st.Waiters != 2 || st.Known != known.For(c.m) ||
			c.m == backend.Permit && st.Limit != 2 {
			t.Fatalf("%v: Inspect = %+v, want the holder %+v and the queue b,c", c.m, st, want)
		}
		nodes, _, err := ops.listing(ctx, ops.queueParent(first))
		if err != nil || len(nodes) != 3 {
			t.Fatalf("%v: queue %+v, %v", c.m, nodes, err)
		}
		_, next, err := ops.conn.Exists(ops.queueParent(first) + "/" + nodes[1].name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ops.Break(ctx, key, c.m, uint64(next.Czxid)); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("%v: Break under a waiter's fence = %v, want ErrNotHeld", c.m, err)
		}
		if st, err = ops.Break(ctx, key, c.m, g.Fence); err != nil || !slices.Equal(st.Holders, want) {
			t.Fatalf("%v: Break = %+v, %v; want just %+v", c.m, st, err, want)
		}
		select {
		case err := <-lost:
			if !errors.Is(err, backend.ErrLost) {
				t.Errorf("%v: OnLost(%v), want ErrLost", c.m, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%v: the holder was not told of the Break within 2s", c.m)
		}
		var gb backend.Grant
		select {
		case gb = <-granted:
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: the next waiter did not get its grant", c.m)
		}
		st, err = ops.Inspect(ctx, key, c.m)
		want = []backend.Holder{{Mode: c.next, Owner: "b", Fence: gb.Fence, Weight: max(c.claims[1].Weight, 1)}}
		if err != nil || !slices.Equal(st.Holders, want) || strings.Join(st.Queue, ",") != "c" {
			t.Fatalf("%v: Inspect after the Break = %+v, %v; want the holder %+v and the queue c", c.m, st, err, want)
		}
		wcancel()
	}
}
