package etcdlock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// The benchmarks run etcdlock and etcd's own concurrency.Mutex side by side
// on the same server (the single etcd, or LOCKER_ETCD_ENDPOINTS):
//
//	go test -run '^$' -bench . -benchtime 3s ./etcdlock
//
// Uncontended: one worker acquires and releases one name; the raw floor
// (floor.go: concurrency.Mutex's requests on the driver's client) and a
// lock with LockDelay (delay/etcdlock) run in the same loop.
// Contended: 8 workers on 2 clients take turns on one name, holding it 1ms,
// through internal/bench's harness; each contender's figures carry its name
// as a prefix (etcdlock-handoff-p50-µs, mutex-handoff-p50-µs, ...).
//
// Both interleave the contenders, so that the load of a shared machine
// falls on each alike, and report ratios.

type benchLocker interface {
	lock(ctx context.Context) (unlock func(context.Context) error, err error)
}

type benchSetup struct {
	name string
	// new returns n lockers on the same name, spread over 2 clients, and
	// the first client (for the round trip).
	new func(b *testing.B, n int) ([]benchLocker, *clientv3.Client)
}

func benchClient(b *testing.B) *clientv3.Client {
	b.Helper()
	testenv.Require(b, testenv.EtcdEndpoints()...)
	cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

type etcdlockLocker struct {
	c    *locker.Client
	name string
	opts []locker.LockOption
}

func (e etcdlockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	l, err := e.c.Acquire(ctx, e.name, e.opts...)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

type mutexLocker struct{ m *concurrency.Mutex }

func (m mutexLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := m.m.Lock(ctx); err != nil {
		return nil, err
	}
	return m.m.Unlock, nil
}

var setups = []benchSetup{
	{"etcdlock", func(b *testing.B, n int) ([]benchLocker, *clientv3.Client) {
		prefix := fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano())
		var cs []*locker.Client
		var first *clientv3.Client
		for range min(n, 2) {
			cli := benchClient(b)
			if first == nil {
				first = cli
			}
			c, err := locker.New(mustNew(b, cli, WithPrefix(prefix)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		out := make([]benchLocker, n)
		for i := range out {
			out[i] = etcdlockLocker{cs[i%len(cs)], "bench", nil}
		}
		return out, first
	}},
	{"concurrency.Mutex", func(b *testing.B, n int) ([]benchLocker, *clientv3.Client) {
		pfx := fmt.Sprintf("/locker-bench-mutex/%d", time.Now().UnixNano())
		var clis []*clientv3.Client
		for range min(n, 2) {
			clis = append(clis, benchClient(b))
		}
		out := make([]benchLocker, n)
		for i := range out {
			// A Mutex needs a session of its own: two Mutexes of one session
			// on one name share a key, and both "hold" the lock.
			s, err := concurrency.NewSession(clis[i%len(clis)])
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			out[i] = mutexLocker{concurrency.NewMutex(s, pfx)}
		}
		return out, clis[0]
	}},
}

// BenchmarkUncontended interleaves the contenders, one acquire+release of
// each per iteration, so that the load of a shared machine falls on all of
// them alike; it reports each one's median cycle and the ratios.
func BenchmarkUncontended(b *testing.B) {
	ls := make([]benchLocker, len(setups))
	for i, s := range setups {
		l, _ := s.new(b, 1)
		ls[i] = l[0]
	}
	// The driver alone, without the locker package's bookkeeping.
	d, err := New(benchClient(b), WithPrefix(fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano())))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	floor, _ := measure.RawFloor(d)
	// A lock with a delay, released: its marker goes in the same requests.
	delayed := ls[0].(etcdlockLocker)
	delayed.name, delayed.opts = "bench-delay", []locker.LockOption{locker.LockDelay(time.Minute)}
	ls = append(ls, driverLocker{d}, floorLocker(floor), delayed)
	names := []string{"etcdlock", "mutex", "driver", "floor", "delay"}
	ctx := context.Background()
	times := make([][]time.Duration, len(ls))
	b.ResetTimer()
	for n := range b.N {
		for k := range ls {
			i := (n + k) % len(ls) // rotate, so that no one always goes first
			l := ls[i]
			start := time.Now()
			unlock, err := l.lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := unlock(ctx); err != nil {
				b.Fatal(err)
			}
			times[i] = append(times[i], time.Since(start))
		}
	}
	b.StopTimer()
	med := make([]float64, len(ls))
	for i, ts := range times {
		med[i] = float64(bench.Percentile(ts, 0.5))
		b.ReportMetric(med[i]/1e6, names[i]+"-ms")
	}
	b.ReportMetric(med[0]/med[1], "etcdlock/mutex")
	b.ReportMetric(med[2]/med[1], "driver/mutex")
	b.ReportMetric(med[0]/med[3], "etcdlock/floor")
	b.ReportMetric(med[4]/med[0], "delay/etcdlock")
}

// floorLocker runs the driver's raw floor (concurrency.Mutex's requests)
// as one cycle.
type floorLocker func(ctx context.Context, key string) error

func (f floorLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	if err := f(ctx, "bench/floor"); err != nil {
		return nil, err
	}
	return func(context.Context) error { return nil }, nil
}

type driverLocker struct{ d *Driver }

func (dl driverLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	l := backend.Claim{Key: "bench/x", Token: testutil.Token(), TTL: 30 * time.Second}
	g, t, err := dl.d.Enqueue(ctx, l)
	if t != nil {
		t.Leave(ctx)
		return nil, fmt.Errorf("queued on a free name: %v", err)
	}
	if err != nil {
		return nil, err
	}
	l.Fence = g.Fence
	return func(ctx context.Context) error { return dl.d.Release(ctx, l) }, nil
}

// BenchmarkContended alternates rounds of the contenders (one round per
// iteration: 250 acquisitions each, 8 workers on 2 clients holding the name
// 1ms), so that the load of a shared machine falls on both alike, through
// the contended harness (internal/bench). The round trip is a write (a
// put) on the contender's first client, during its round.
func BenchmarkContended(b *testing.B) {
	const workers = 8
	const perRound = 250
	ctx := context.Background()
	runs := make([]bench.Contend, len(setups))
	for i, s := range setups {
		ls, cli := s.new(b, workers)
		key := fmt.Sprintf("/locker-bench-rtt/%d", time.Now().UnixNano())
		b.Cleanup(func() { cli.Delete(ctx, key) })
		runs[i] = bench.Contend{Hold: time.Millisecond, Acquisitions: perRound, RoundTripOp: "put", RoundTripEvery: 20 * time.Millisecond,
			RoundTrip: func(ctx context.Context) error { _, err := cli.Put(ctx, key, "x"); return err }}
		for w, l := range ls {
			runs[i].Workers = append(runs[i].Workers, bench.Worker{Client: w % 2, Acquire: l.lock})
		}
	}
	names := []string{"etcdlock", "mutex"}
	all := make([]*bench.Samples, len(runs))
	b.ResetTimer()
	for range b.N {
		for i, run := range runs {
			s, err := run.Run(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if all[i] == nil {
				all[i] = s
			} else {
				all[i].Add(s)
			}
		}
	}
	b.StopTimer()
	sums := make([]bench.Contention, len(runs))
	for i, s := range all {
		sums[i] = s.Summary()
		sums[i].Report(b, names[i])
	}
	b.ReportMetric(sums[0].AcquisitionsSec/sums[1].AcquisitionsSec, "etcdlock/mutex-acq/s")
}
