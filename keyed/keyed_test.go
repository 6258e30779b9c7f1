package keyed_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/keyed"
	_ "github.com/lockerhq/locker/memcachelock"
	"github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/zklock"
)

func uniq() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// withNamespace gives raw a namespace of the test's own and a 2 s TTL.
func withNamespace(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("namespace", "keyed-"+uniq())
	q.Set("ttl", "2s")
	u.RawQuery = q.Encode()
	return u.String()
}

type target struct {
	name  string
	addrs []string
	url   func(t testing.TB) string
}

// targets are the backends, on the servers of scripts/services.sh (as in
// cmd/lockctl's e2e tests), plus Redis's fair mode.
func targets() []target {
	fixed := func(raw string) func(testing.TB) string {
		return func(testing.TB) string { return withNamespace(raw) }
	}
	return []target{
		{name: "mem", url: func(testing.TB) string { return withNamespace("mem://keyed-" + uniq()) }},
		{name: "file", url: func(t testing.TB) string {
			return withNamespace((&url.URL{Scheme: "file", Path: t.TempDir()}).String())
		}},
		{name: "redis", addrs: []string{testenv.RedisAddr()}, url: fixed("redis://" + testenv.RedisAddr() + "/0")},
		{name: "redis-fair", addrs: []string{testenv.RedisAddr()}, url: fixed("redis://" + testenv.RedisAddr() + "/0?fair=true")},
		{name: "etcd", addrs: testenv.EtcdEndpoints(),
			url: fixed("etcd://" + strings.Join(testenv.EtcdEndpoints(), ",") + "/locker-keyed")},
		{name: "zk", addrs: testenv.ZKAddrs(),
			url: fixed("zk://" + strings.Join(testenv.ZKAddrs(), ",") + "/locker-keyed?session_timeout=2s")},
		{name: "postgres", addrs: []string{testenv.PostgresAddr()}, url: fixed(testenv.PostgresURL())},
		{name: "memcache", addrs: []string{testenv.MemcacheAddr()}, url: fixed("memcache://" + testenv.MemcacheAddr())},
	}
}

func open(t testing.TB, raw string) *locker.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, raw)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recorder checks the tasks of a scenario as they run.
type recorder struct {
	running  map[string]*atomic.Int32 // per key: tasks running now
	overlaps atomic.Int32
	ran      atomic.Int32

	mu         sync.Mutex
	last       map[string]int // per executor and key: the last index run
	outOfOrder int
}

func newRecorder(keys []string) *recorder {
	r := &recorder{running: map[string]*atomic.Int32{}, last: map[string]int{}}
	for _, k := range keys {
		r.running[k] = new(atomic.Int32)
	}
	return r
}

func (r *recorder) task(proc int, key string, i int, hold time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		if r.running[key].Add(1) > 1 {
			r.overlaps.Add(1)
		}
		defer r.running[key].Add(-1)
		r.mu.Lock()
		pk := fmt.Sprint(proc, "/", key)
		if last, ok := r.last[pk]; ok && i <= last || !ok && i != 0 {
			r.outOfOrder++
		}
		r.last[pk] = i
		r.mu.Unlock()
		r.ran.Add(1)
		if keyed.LockFromContext(ctx) == nil {
			return errors.New("no lock in the task's context")
		}
		time.Sleep(hold)
		return nil
	}
}

// scenario runs 2 Executors (one per Client, as two processes) × 6 keys ×
// 10 tasks each, every key's tasks queued at once by one goroutine, and
// checks exclusion, per-process order and that everything ran.
func scenario(t *testing.T, c1, c2 *locker.Client, opts ...keyed.Option) []keyed.Stats {
	const keys, tasks = 6, 10
	var names []string
	for k := range keys {
		names = append(names, fmt.Sprintf("key-%d", k))
	}
	r := newRecorder(names)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var exs []*keyed.Executor
	var wg sync.WaitGroup
	errs := make(chan error, 2*keys*tasks)
	for p, c := range []*locker.Client{c1, c2} {
		ex := keyed.New(c, opts...)
		exs = append(exs, ex)
		for _, key := range names {
			wg.Go(func() {
				var results []<-chan error
				for i := range tasks {
					results = append(results, ex.Go(ctx, key, r.task(p, key, i, time.Millisecond)))
				}
				for _, res := range results {
					errs <- <-res
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("task: %v", err)
		}
	}
	var stats []keyed.Stats
	for _, ex := range exs {
		ex.Close()
		stats = append(stats, ex.Stats())
	}
	if n := r.overlaps.Load(); n != 0 {
		t.Errorf("%d tasks ran while another of their key ran", n)
	}
	if r.outOfOrder != 0 {
		t.Errorf("%d tasks ran out of their process's submission order", r.outOfOrder)
	}
	if n := r.ran.Load(); n != 2*keys*tasks {
		t.Errorf("%d tasks ran, want %d", n, 2*keys*tasks)
	}
	if got := stats[0].Tasks + stats[1].Tasks; got != 2*keys*tasks {
		t.Errorf("Stats count %d tasks, want %d", got, 2*keys*tasks)
	}
	t.Logf("tasks %d, lock acquisitions %d + %d", 2*keys*tasks, stats[0].Acquisitions, stats[1].Acquisitions)
	return stats
}

// lossTask blocks until its context ends (bounded) and reports the cause.
func lossTask(fences chan<- uint64, cause chan<- error) func(context.Context) error {
	return func(ctx context.Context) error {
		fences <- keyed.LockFromContext(ctx).Fence()
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
			return ctx.Err()
		case <-time.After(20 * time.Second):
			cause <- nil
			return errors.New("the task's context outlived the lock by 20 s")
		}
	}
}

// checkLoss runs a task, takes its lock away with take, and checks that
// the task's context is cancelled with the loss, that Submit says so, and
// that the task queued behind it runs under a new lock.
func checkLoss(t *testing.T, ex *keyed.Executor, within time.Duration, take func(fence uint64)) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fences := make(chan uint64, 1)
	cause := make(chan error, 1)
	first := ex.Go(ctx, "lost", lossTask(fences, cause))
	var next uint64
	second := ex.Go(ctx, "lost", func(ctx context.Context) error {
		next = keyed.LockFromContext(ctx).Fence()
		return nil
	})
	var fence uint64
	select {
	case fence = <-fences:
	case <-ctx.Done():
		t.Fatal("the first task did not start")
	}
	start := time.Now()
	take(fence)
	if err := <-cause; !errors.Is(err, locker.ErrLost) {
		t.Errorf("the task's context cause = %v, want ErrLost", err)
	}
	took := time.Since(start)
	if took > within {
		t.Errorf("the task saw the loss %v after it, want within %v", took, within)
	}
	if err := <-first; !errors.Is(err, locker.ErrLost) {
		t.Errorf("Submit = %v, want ErrLost", err)
	}
	if err := <-second; err != nil {
		t.Errorf("the next task: %v", err)
	}
	if next <= fence {
		t.Errorf("the next task's fence %d, want above the lost lock's %d", next, fence)
	}
	t.Logf("loss seen by the task %v after it was taken", took.Round(time.Millisecond))
}

// TestBackends runs the scenario and a lock loss on every backend.
func TestBackends(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			raw := tg.url(t)
			c1, c2 := open(t, raw), open(t, raw)
			scenario(t, c1, c2, keyed.Concurrency(4), keyed.Batch(4, time.Second))
			ex := keyed.New(c1)
			defer ex.Close()
			// The holder's next check (TTL/3, a watch on ZooKeeper) finds
			// the lock taken; every Client here has a 2 s TTL.
			checkLoss(t, ex, 2*time.Second, func(fence uint64) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := c2.ForceRelease(ctx, "lost", fence); err != nil {
					t.Errorf("ForceRelease: %v", err)
				}
			})
		})
	}
}

// memClients are two Clients on one memlock Store, as two processes on
// one store.
func memClients(t *testing.T) (*memlock.Store, string, *locker.Client, *locker.Client) {
	s := memlock.NewStore()
	ns := "keyed-" + uniq()
	var cs []*locker.Client
	for range 2 {
		d, err := memlock.New(s)
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(d, locker.WithNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return s, ns, cs[0], cs[1]
}

func TestScenarioMem(t *testing.T) {
	_, _, c1, c2 := memClients(t)
	scenario(t, c1, c2)
}

// TestLostMem expires the lock in the store, as its TTL running out
// would, with the watchdog on.
func TestLostMem(t *testing.T) {
	s, ns, c1, _ := memClients(t)
	const ttl = time.Second
	ex := keyed.New(c1, keyed.TTL(ttl))
	defer ex.Close()
	// The watchdog's next refresh (every TTL/3) finds the lock gone.
	checkLoss(t, ex, ttl, func(uint64) {
		if !s.Expire(backend.Key(ns, "lost")) {
			t.Error("Expire found no lock")
		}
	})
}

// TestBatching queues 10 tasks of one key before the first can start and
// counts the locks taken for them.
func TestBatching(t *testing.T) {
	for _, tc := range []struct {
		batch int
		want  int64
	}{{1, 10}, {3, 4}, {64, 1}} {
		t.Run(fmt.Sprint(tc.batch), func(t *testing.T) {
			_, _, c, _ := memClients(t)
			ex := keyed.New(c, keyed.Batch(tc.batch, time.Minute))
			defer ex.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			gate := make(chan struct{})
			var order []int
			var results []<-chan error
			for i := range 10 {
				results = append(results, ex.Go(ctx, "k", func(ctx context.Context) error {
					if i == 0 {
						<-gate // the others queue meanwhile
					}
					order = append(order, i) // serial: no lock needed
					return nil
				}))
			}
			close(gate)
			for _, r := range results {
				if err := <-r; err != nil {
					t.Fatal(err)
				}
			}
			if fmt.Sprint(order) != "[0 1 2 3 4 5 6 7 8 9]" {
				t.Errorf("order %v", order)
			}
			if st := ex.Stats(); st.Acquisitions != tc.want || st.Tasks != 10 {
				t.Errorf("Stats %+v, want %d acquisitions for 10 tasks", st, tc.want)
			}
		})
	}
}

// TestClose: a running task finishes, a queued one fails with ErrClosed,
// a new one is refused with it, and Close returns after the lock is free.
func TestClose(t *testing.T) {
	_, _, c1, c2 := memClients(t)
	ex := keyed.New(c1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started, finish := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	running := ex.Go(ctx, "k", func(ctx context.Context) error {
		close(started)
		<-finish
		finished.Store(true)
		return nil
	})
	queued := ex.Go(ctx, "k", func(context.Context) error { return errors.New("ran after Close") })
	<-started
	closed := make(chan struct{})
	go func() { ex.Close(); close(closed) }()
	// Close waits for the running task.
	select {
	case <-closed:
		t.Fatal("Close returned while a task ran")
	case <-time.After(50 * time.Millisecond):
	}
	if err := ex.Submit(ctx, "other", func(context.Context) error { return nil }); !errors.Is(err, keyed.ErrClosed) {
		t.Errorf("Submit after Close = %v, want ErrClosed", err)
	}
	close(finish)
	<-closed
	if !finished.Load() {
		t.Error("Close returned before the running task ended")
	}
	if err := <-running; err != nil {
		t.Errorf("running task: %v", err)
	}
	if err := <-queued; !errors.Is(err, keyed.ErrClosed) {
		t.Errorf("queued task = %v, want ErrClosed", err)
	}
	l, err := c2.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("the key's lock after Close: %v", err)
	}
	l.Release(ctx)
}

// TestCancelQueued: a task whose context ends while it waits leaves the
// queue, the others run in order, and a wait for a lock nobody needs ends.
func TestCancelQueued(t *testing.T) {
	_, _, c1, c2 := memClients(t)
	ex := keyed.New(c1)
	defer ex.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The other process holds the key: ex's runner waits for it.
	l, err := c2.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithCancelCause(ctx)
	var ran atomic.Int32
	res := ex.Go(tctx, "k", func(context.Context) error { ran.Add(1); return nil })
	cause := errors.New("caller gave up")
	tcancel(cause)
	if err := <-res; !errors.Is(err, cause) {
		t.Errorf("cancelled task = %v, want its cause", err)
	}
	// The runner stopped waiting: a new task queues a new wait and runs
	// once the lock is free.
	var order []int
	a := ex.Go(ctx, "k", func(context.Context) error { order = append(order, 1); return nil })
	b := ex.Go(ctx, "k", func(context.Context) error { order = append(order, 2); return nil })
	l.Release(ctx)
	if err := errors.Join(<-a, <-b); err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 0 || fmt.Sprint(order) != "[1 2]" {
		t.Errorf("cancelled task ran %d times, order %v", ran.Load(), order)
	}
}

// TestInputErrors: bad input gets a typed error before any call.
func TestInputErrors(t *testing.T) {
	_, _, c, _ := memClients(t)
	ctx := context.Background()
	ok := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name string
		ex   *keyed.Executor
		key  string
		fn   func(context.Context) error
		want error
	}{
		{"nil fn", keyed.New(c), "k", nil, keyed.ErrNilTask},
		{"empty key", keyed.New(c), "", ok, locker.ErrInvalidName},
		{"long key", keyed.New(c), strings.Repeat("k", locker.MaxNameLen+1), ok, locker.ErrInvalidName},
		{"nil client", keyed.New(nil), "k", ok, keyed.ErrInvalidOption},
		{"concurrency", keyed.New(c, keyed.Concurrency(0)), "k", ok, keyed.ErrInvalidOption},
		{"batch", keyed.New(c, keyed.Batch(0, time.Second)), "k", ok, keyed.ErrInvalidOption},
		{"hold", keyed.New(c, keyed.Batch(1, 0)), "k", ok, keyed.ErrInvalidOption},
		{"ttl", keyed.New(c, keyed.TTL(-time.Second)), "k", ok, locker.ErrInvalidTTL},
	} {
		if err := tc.ex.Submit(ctx, tc.key, tc.fn); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		tc.ex.Close()
	}
}

// TestFIFOAcrossProcesses: on the backends that queue waiters in arrival
// order, batches are granted in the order the processes asked. A holds
// the key; B, then C, ask; A's next task joins A's batch; then B's, then
// C's task runs.
func TestFIFOAcrossProcesses(t *testing.T) {
	for _, tg := range targets() {
		switch tg.name {
		case "redis", "redis-fair", "etcd", "zk": // file queues too, but reports no waiters
		default:
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
			testenv.Require(t, tg.addrs...)
			raw := tg.url(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var exs []*keyed.Executor
			for range 3 {
				ex := keyed.New(open(t, raw), keyed.Batch(64, time.Minute))
				defer ex.Close()
				exs = append(exs, ex)
			}
			inspector := open(t, raw)
			var mu sync.Mutex
			var order []string
			task := func(name string, gate <-chan struct{}, started chan<- struct{}) func(context.Context) error {
				return func(context.Context) error {
					if started != nil {
						close(started)
					}
					if gate != nil {
						<-gate
					}
					mu.Lock()
					order = append(order, name)
					mu.Unlock()
					return nil
				}
			}
			// waiters waits, bounded, until n acquisitions queue in the store.
			waiters := func(n int) {
				t.Helper()
				for range 500 {
					st, err := inspector.Inspect(ctx, "k")
					if err != nil {
						t.Fatalf("Inspect: %v", err)
					}
					if !st.Known.Has(locker.KnowsWaiters) {
						t.Fatal("the store does not report waiters")
					}
					if st.Waiters >= n {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				t.Fatalf("%d waiters did not queue within 5 s", n)
			}
			gate, started := make(chan struct{}), make(chan struct{})
			var once sync.Once
			letGo := func() { once.Do(func() { close(gate) }) }
			defer letGo() // before the executors' Close, which waits for a1
			a1 := exs[0].Go(ctx, "k", task("a1", gate, started))
			select {
			case <-started:
			case <-ctx.Done():
				t.Fatal("the first task did not start")
			}
			b1 := exs[1].Go(ctx, "k", task("b1", nil, nil))
			waiters(1)
			c1 := exs[2].Go(ctx, "k", task("c1", nil, nil))
			waiters(2)
			a2 := exs[0].Go(ctx, "k", task("a2", nil, nil))
			letGo()
			for _, r := range []<-chan error{a1, a2, b1, c1} {
				if err := <-r; err != nil {
					t.Fatal(err)
				}
			}
			if got := fmt.Sprint(order); got != "[a1 a2 b1 c1]" {
				t.Errorf("order %s, want [a1 a2 b1 c1]", got)
			}
		})
	}
}
