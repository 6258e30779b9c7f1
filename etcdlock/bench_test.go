package etcdlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// The benchmarks run etcdlock and etcd's own concurrency.Mutex side by side
// on the same server (the single etcd, or LOCKER_ETCD_ENDPOINTS):
//
//	go test -run '^$' -bench . -benchtime 3s ./etcdlock
//
// Uncontended: one worker acquires and releases one name.
// Contended: 8 workers on 2 clients take turns on one name, holding it 1ms;
// acq/s is acquisitions per second, handoff-ms the median time from a
// release call to the next holder's grant, rtt-ms the server's median round
// trip for a write (a put) measured meanwhile.
//
// Both interleave the contenders, so that the load of a shared machine
// falls on each alike, and report ratios.

type benchLocker interface {
	lock(ctx context.Context) (unlock func(context.Context) error, err error)
}

type benchSetup struct {
	name string
	// new returns n lockers on the same name, spread over 2 clients.
	new func(b *testing.B, n int) []benchLocker
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
}

func (e etcdlockLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	l, err := e.c.Acquire(ctx, e.name)
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
	{"etcdlock", func(b *testing.B, n int) []benchLocker {
		prefix := fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano())
		var cs []*locker.Client
		for range min(n, 2) {
			c, err := locker.New(mustNew(b, benchClient(b), WithPrefix(prefix)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		out := make([]benchLocker, n)
		for i := range out {
			out[i] = etcdlockLocker{cs[i%len(cs)], "bench"}
		}
		return out
	}},
	{"concurrency.Mutex", func(b *testing.B, n int) []benchLocker {
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
		return out
	}},
}

// BenchmarkUncontended interleaves the contenders, one acquire+release of
// each per iteration, so that the load of a shared machine falls on all of
// them alike; it reports each one's median cycle and the ratios.
func BenchmarkUncontended(b *testing.B) {
	ls := make([]benchLocker, len(setups))
	for i, s := range setups {
		ls[i] = s.new(b, 1)[0]
	}
	// The driver alone, without the locker package's bookkeeping.
	d, err := New(benchClient(b), WithPrefix(fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano())))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	ls = append(ls, driverLocker{d})
	names := []string{"etcdlock", "mutex", "driver"}
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
		slices.Sort(ts)
		med[i] = float64(ts[len(ts)/2])
		b.ReportMetric(med[i]/1e6, names[i]+"-ms")
	}
	b.ReportMetric(med[0]/med[1], "etcdlock/mutex")
	b.ReportMetric(med[2]/med[1], "driver/mutex")
}

type driverLocker struct{ d *Driver }

func (dl driverLocker) lock(ctx context.Context) (func(context.Context) error, error) {
	var tb [16]byte
	rand.Read(tb[:])
	l := backend.Claim{Key: "bench/x", Token: hex.EncodeToString(tb[:]), TTL: 30 * time.Second}
	g, err := dl.d.Acquire(ctx, l)
	if err != nil {
		return nil, err
	}
	l.Fence = g.Fence
	return func(ctx context.Context) error { return dl.d.Release(ctx, l) }, nil
}

// rttProbe measures the server's round trip for a write (a put) while the
// benchmark runs, one every 20ms, until stop is called; then it returns the
// median.
func rttProbe(b *testing.B) (stop func() time.Duration) {
	cli := benchClient(b)
	ctx := context.Background()
	key := fmt.Sprintf("/locker-bench-rtt/%d", time.Now().UnixNano())
	quit := make(chan struct{})
	done := make(chan []time.Duration)
	go func() {
		var ds []time.Duration
		for {
			select {
			case <-quit:
				done <- ds
				return
			case <-time.After(20 * time.Millisecond):
			}
			start := time.Now()
			if _, err := cli.Put(ctx, key, "x"); err == nil {
				ds = append(ds, time.Since(start))
			}
		}
	}()
	return func() time.Duration {
		close(quit)
		ds := <-done
		cli.Delete(ctx, key)
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
}

// BenchmarkContended alternates rounds of the contenders (one round per
// iteration: 250 acquisitions each), so that the load of a shared machine
// falls on both alike.
func BenchmarkContended(b *testing.B) {
	const workers = 8
	const perRound = 250
	all := make([][]benchLocker, len(setups))
	for i, s := range setups {
		all[i] = s.new(b, workers)
	}
	names := []string{"etcdlock", "mutex"}
	elapsed := make([]time.Duration, len(setups))
	handoffs := make([][]time.Duration, len(setups))
	var rtts []time.Duration
	b.ResetTimer()
	for range b.N {
		for i, ls := range all {
			probe := rttProbe(b)
			e, h := contend(b, ls, perRound)
			rtts = append(rtts, probe())
			elapsed[i] += e
			handoffs[i] = append(handoffs[i], h...)
		}
	}
	b.StopTimer()
	slices.Sort(rtts)
	rtt := rtts[len(rtts)/2]
	rate := make([]float64, len(setups))
	for i := range setups {
		rate[i] = float64(b.N*perRound) / elapsed[i].Seconds()
		b.ReportMetric(rate[i], names[i]+"-acq/s")
		hs := handoffs[i]
		slices.Sort(hs)
		med := hs[len(hs)/2]
		b.ReportMetric(float64(med)/1e6, names[i]+"-handoff-ms")
		if i == 0 {
			b.ReportMetric(float64(med)/float64(rtt), "etcdlock-handoff/rtt")
		}
	}
	b.ReportMetric(rate[0]/rate[1], "acq-ratio")
	b.ReportMetric(float64(rtt)/1e6, "rtt-ms")
}

// contend runs n acquisitions of ls's workers on one name, each holding it
// 1ms, and returns how long they took and the hand-off times: from a
// release call to the next holder's grant.
func contend(b *testing.B, ls []benchLocker, n int) (time.Duration, []time.Duration) {
	const hold = time.Millisecond
	ctx := context.Background()
	var (
		next     atomic.Int64
		released atomic.Int64 // when the last release call began, in ns
		mu       sync.Mutex
		handoffs []time.Duration
		wg       sync.WaitGroup
	)
	start := time.Now()
	for _, l := range ls {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				unlock, err := l.lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now().UnixNano()
				if r := released.Load(); r != 0 {
					mu.Lock()
					handoffs = append(handoffs, time.Duration(now-r))
					mu.Unlock()
				}
				time.Sleep(hold)
				released.Store(time.Now().UnixNano())
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), handoffs
}
