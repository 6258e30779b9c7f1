package peers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/etcdlock"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
)

// Parallel: 16 goroutines of one client, each on a name of its own, the
// subjects in alternating blocks over rounds (bench.Interleave); each ratio
// is taken within a round, reported as its median and range: cycles per
// second, and this process's CPU per cycle, over the peer's.
//
//	cd internal/peers && go test -run '^$' -bench Parallel -benchtime 1x

const (
	parallelGoroutines = 16
	parallelRounds     = 7
	parallelBlock      = 300 * time.Millisecond
)

// parallelSubject is one contender: op runs one acquire+release by
// goroutine g.
type parallelSubject struct {
	name string
	op   func(ctx context.Context, g int) error
}

// runParallel runs the subjects; the first is the one the others are
// compared with. A gauge (nil for none) reads the store's counters around
// each block; its "cpu_us" gives the store's CPU per cycle, its other
// counters are logged per cycle.
func runParallel(b *testing.B, gauge bench.Gauge, subjects ...parallelSubject) {
	ops := make([]func(context.Context, int) error, len(subjects))
	for i, s := range subjects {
		ops[i] = s.op
	}
	b.ResetTimer()
	rounds, err := bench.InterleaveGauged(context.Background(), gauge, parallelGoroutines, parallelRounds, parallelBlock, ops...)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	metrics := []struct {
		unit string
		f    func(bench.Round) float64
	}{{"", bench.PerSec}, {"cpu-", bench.CPUPerCycle}}
	if gauge != nil {
		metrics = append(metrics, struct {
			unit string
			f    func(bench.Round) float64
		}{"server-cpu-", storePerCycle("cpu_us")})
	}
	for i, s := range subjects {
		r := bench.RateOf(rounds[i])
		b.ReportMetric(r.PerSec.Median, s.name+"-cycles/s")
		b.ReportMetric(float64(r.CPU)/1e3, s.name+"-cpu-µs/cycle")
		if gauge != nil {
			med, _, _ := medianRange(mapRounds(rounds[i], storePerCycle("cpu_us")))
			b.ReportMetric(med, s.name+"-server-µs/cycle")
			b.Logf("%s: the store's counters per cycle: %s", s.name, storeCounters(rounds[i]))
		}
		if i == 0 {
			continue
		}
		for _, m := range metrics {
			sp := bench.Ratio(rounds[i], rounds[0], m.f)
			b.ReportMetric(sp.Median, m.unit+s.name+"/"+subjects[0].name)
			b.ReportMetric(sp.Min, m.unit+s.name+"/"+subjects[0].name+"-min")
			b.ReportMetric(sp.Max, m.unit+s.name+"/"+subjects[0].name+"-max")
			b.Logf("%s%s/%s per round: median %.2f, range %.2f–%.2f, %d rounds of %v", m.unit, s.name, subjects[0].name, sp.Median, sp.Min, sp.Max, sp.Rounds, parallelBlock)
		}
	}
}

// storePerCycle is a gauge's counter per cycle in a round.
func storePerCycle(counter string) func(bench.Round) float64 {
	return func(r bench.Round) float64 {
		if r.Cycles == 0 {
			return 0
		}
		return r.Store[counter] / float64(r.Cycles)
	}
}

func mapRounds(rs []bench.Round, f func(bench.Round) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// storeCounters sums a subject's gauged counters over its rounds, per
// cycle, by name.
func storeCounters(rs []bench.Round) string {
	var cycles float64
	sum := map[string]float64{}
	for _, r := range rs {
		cycles += float64(r.Cycles)
		for k, v := range r.Store {
			sum[k] += v
		}
	}
	names := slices.Sorted(maps.Keys(sum))
	var s strings.Builder
	for _, k := range names {
		if sum[k] != 0 {
			fmt.Fprintf(&s, "%s %.2f; ", k, sum[k]/cycles)
		}
	}
	return s.String()
}

// clientCycle is acquire+release of name on c.
func clientCycle(ctx context.Context, c *locker.Client, name string) error {
	l, err := c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

// BenchmarkEtcdParallel: etcdlock through a Client against
// concurrency.Mutex (one session, a Mutex per goroutine) and the raw floor,
// all on one etcd client.
func BenchmarkEtcdParallel(b *testing.B) {
	cli := etcdClient(b, nil)
	run := fmt.Sprintf("/locker-peers/%d", time.Now().UnixNano())
	d, err := etcdlock.New(cli, etcdlock.WithPrefix(run+"/etcdlock"))
	if err != nil {
		b.Fatal(err)
	}
	floor, _ := measure.RawFloor(d)
	c, err := locker.New(d)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	b.Cleanup(func() { _, _ = cli.Delete(context.Background(), run, clientv3.WithPrefix()) })
	runParallel(b, nil,
		parallelSubject{"mutex", func(ctx context.Context, g int) error {
			m := concurrency.NewMutex(s, fmt.Sprintf("%s/mutex/%d", run, g))
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		}},
		parallelSubject{"etcdlock", func(ctx context.Context, g int) error { return clientCycle(ctx, c, fmt.Sprint("n", g)) }},
		parallelSubject{"floor", func(ctx context.Context, g int) error { return floor(ctx, fmt.Sprint("f", g)) }},
	)
}

// BenchmarkZKParallel: zklock through a Client against the raw floor (an
// ephemeral node created and deleted) and zk.Lock, all on one session.
func BenchmarkZKParallel(b *testing.B) {
	run := fmt.Sprintf("/locker-peers-%d", time.Now().UnixNano())
	d := zkDriver(b, run+"/zklock")
	conn := d.Conn()
	floor, _ := measure.RawFloor(d)
	c, err := locker.New(d)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	b.Cleanup(func() { zkRemove(conn, run) })
	runParallel(b, nil,
		parallelSubject{"floor", func(ctx context.Context, g int) error { return floor(ctx, fmt.Sprint("f", g)) }},
		parallelSubject{"zklock", func(ctx context.Context, g int) error { return clientCycle(ctx, c, fmt.Sprint("n", g)) }},
		parallelSubject{"zk.Lock", func(ctx context.Context, g int) error {
			l := zk.NewLock(conn, fmt.Sprintf("%s/zklock-peer/%d", run, g), zk.WorldACL(zk.PermAll))
			if err := l.Lock(); err != nil {
				return err
			}
			return l.Unlock()
		}},
	)
}
