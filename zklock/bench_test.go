package zklock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// The benchmarks run zklock and the zk package's own zk.Lock side by side,
// on the same server, in the same loop, and report the ratios.
//
//	go test -run '^$' -bench . ./zklock

func benchConn(b *testing.B, servers []string) *zk.Conn {
	b.Helper()
	conn, _, err := zk.Connect(servers, testTimeout, zk.WithLogInfo(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitSession(ctx, conn); err != nil {
		b.Fatal(err)
	}
	return conn
}

// rtt is the median round trip of a read on conn.
func rtt(b *testing.B, conn *zk.Conn) time.Duration {
	var ds []time.Duration
	for range 200 {
		start := time.Now()
		if _, _, err := conn.Exists("/"); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	return median(ds)
}

// writeRTT is the median round trip of a write (a delete's cost) on conn.
func writeRTT(b *testing.B, conn *zk.Conn, dir string) time.Duration {
	var ds []time.Duration
	p := dir + "/write-rtt"
	ensurePath(b, conn, p)
	for range 200 {
		start := time.Now()
		if _, err := conn.Set(p, nil, -1); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	return median(ds)
}

func median(ds []time.Duration) time.Duration { return bench.Percentile(ds, 0.5) }

func ensurePath(b *testing.B, conn *zk.Conn, path string) {
	if _, err := conn.Create(path, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
}

// BenchmarkUncontended: acquire and release, nobody else around, on a name
// used before (its parent exists) and on a fresh one, and the raw floor (an
// ephemeral node created and deleted). Metrics: microseconds per
// acquire+release for each, zklock's time over zk.Lock's, and the fresh
// cycle's ops/s in the floor's.
func BenchmarkUncontended(b *testing.B) {
	servers := testenv.ZKAddrs()
	testenv.Require(b, servers...)
	d := dial(b, servers)
	conn := benchConn(b, servers)
	base := "/locker-bench-zk"
	ensurePath(b, conn, base)
	run := fmt.Sprintf("%s/%d", base, time.Now().UnixNano())
	ensurePath(b, conn, run)
	ctx := context.Background()
	known := uniqueKey(b)
	zkKnown := zk.NewLock(conn, run+"/known", zk.WorldACL(zk.PermAll))

	ours := func(key string) time.Duration {
		l := lockFor(b, key)
		start := time.Now()
		if _, err := acquire(ctx, d, l); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	theirs := func(l *zk.Lock) time.Duration {
		start := time.Now()
		if err := l.Lock(); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	ours(known)
	theirs(zkKnown)
	raw, _ := measure.RawFloor(d)
	floor := func(i int) time.Duration {
		start := time.Now()
		if err := raw(ctx, fmt.Sprintf("bench-%d", i)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var oursKnown, theirsKnown, oursFresh, theirsFresh, floors []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		oursKnown = append(oursKnown, ours(known))
		theirsKnown = append(theirsKnown, theirs(zkKnown))
		oursFresh = append(oursFresh, ours(fmt.Sprintf("%s/%d", known, i)))
		theirsFresh = append(theirsFresh, theirs(zk.NewLock(conn, fmt.Sprintf("%s/fresh-%d", run, i), zk.WorldACL(zk.PermAll))))
		floors = append(floors, floor(i))
	}
	b.StopTimer()
	r := rtt(b, conn)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	ok, tk, of, tf := median(oursKnown), median(theirsKnown), median(oursFresh), median(theirsFresh)
	b.ReportMetric(us(r), "rtt-µs")
	b.ReportMetric(us(ok), "zklock-known-µs")
	b.ReportMetric(us(tk), "zkLock-known-µs")
	b.ReportMetric(us(of), "zklock-fresh-µs")
	b.ReportMetric(us(tf), "zkLock-fresh-µs")
	b.ReportMetric(float64(ok)/float64(tk), "known-ratio")
	b.ReportMetric(float64(of)/float64(tf), "fresh-ratio")
	b.ReportMetric(float64(of)/float64(ok), "zklock-fresh/known")
	// The raw floor's ops/s over ours: ZooKeeper's least for a cycle.
	fl := median(floors)
	b.ReportMetric(us(fl), "floor-µs")
	b.ReportMetric(float64(fl)/float64(of), "zklock-fresh-ops/floor-ops")
	// zk.Lock leaves its persistent parents behind; clean up.
	cleanup(conn, run)
}

// floor is the least any ZooKeeper lock's handoff can take: from one
// client's delete of a node to another's news of it, through a watch.
func floor(b *testing.B, a, c *zk.Conn, dir string) time.Duration {
	p, err := a.Create(dir+"/floor-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		b.Fatal(err)
	}
	_, _, ch, err := a.GetW(p)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := c.Delete(p, -1); err != nil {
		b.Fatal(err)
	}
	<-ch
	return time.Since(start)
}

func cleanup(conn *zk.Conn, path string) {
	names, _, _ := conn.Children(path)
	for _, n := range names {
		cleanup(conn, path+"/"+n)
	}
	conn.Delete(path, -1)
}

// BenchmarkContended: 8 workers, one connection each, take turns on one
// name, holding it 1ms, through the contended harness (internal/bench),
// alternating rounds of zklock and zk.Lock so that both see the same load.
// The figures carry the contender's name as a prefix; the round trip is a
// read (Exists) on a connection of its own, during each round. floor-µs is
// the least any ZooKeeper lock's handoff can take (a delete seen through a
// watch), write-rtt-µs a write's round trip.
func BenchmarkContended(b *testing.B) {
	servers := testenv.ZKAddrs()
	testenv.Require(b, servers...)
	const workers = 8
	conn := benchConn(b, servers)
	base := "/locker-bench-zk"
	ensurePath(b, conn, base)
	run := fmt.Sprintf("%s/%d", base, time.Now().UnixNano())
	ensurePath(b, conn, run)
	ctx := context.Background()
	key := uniqueKey(b)
	rt := func(context.Context) error { _, _, err := conn.Exists("/"); return err }
	ours := bench.Contend{Hold: time.Millisecond, RoundTrip: rt, RoundTripOp: "exists"}
	theirs := ours
	conns := make([]*zk.Conn, workers)
	for w := range workers {
		d := dial(b, servers)
		ours.Workers = append(ours.Workers, bench.Worker{Client: w, Acquire: func(ctx context.Context) (func(context.Context) error, error) {
			l := lockFor(b, key)
			if _, err := acquire(ctx, d, l); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return d.Release(ctx, l) }, nil
		}})
		conns[w] = benchConn(b, servers)
		zl := zk.NewLock(conns[w], run+"/contended", zk.WorldACL(zk.PermAll))
		theirs.Workers = append(theirs.Workers, bench.Worker{Client: w, Acquire: func(context.Context) (func(context.Context) error, error) {
			if err := zl.Lock(); err != nil {
				return nil, err
			}
			return func(context.Context) error { return zl.Unlock() }, nil
		}})
	}
	// Warm up: every worker's connection, the name's parent.
	for _, r := range []bench.Contend{ours, theirs} {
		r.Acquisitions = 2 * workers
		if _, err := r.Run(ctx); err != nil {
			b.Fatal(err)
		}
	}
	n := max(b.N, 2*workers)
	var om, tm *bench.Samples
	var floors []time.Duration
	b.ResetTimer()
	for done := 0; done < n; done += 50 {
		ours.Acquisitions, theirs.Acquisitions = min(50, n-done), min(50, n-done)
		o, err := ours.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t, err := theirs.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if om == nil {
			om, tm = o, t
		} else {
			om.Add(o)
			tm.Add(t)
		}
		floors = append(floors, floor(b, conns[0], conns[1], run))
	}
	b.StopTimer()
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	om.Summary().Report(b, "zklock")
	tm.Summary().Report(b, "zkLock")
	b.ReportMetric(us(writeRTT(b, conn, run)), "write-rtt-µs")
	b.ReportMetric(us(bench.Percentile(floors, 0.5)), "floor-µs")
	cleanup(conn, run)
}

// BenchmarkInlineCalls: an uncontended acquire+release on a new name with
// the driver's calls on the caller's goroutine (inline, retry.go) and with
// each on a goroutine of its own, as before, on the same driver, op by op
// with the raw floor, 7 rounds; ratios are ops/s over the floor's (and
// inline over aside), median and range of the rounds.
func BenchmarkInlineCalls(b *testing.B) {
	d := dial(b, testenv.ZKAddrs())
	ctx := context.Background()
	key := uniqueKey(b)
	type sub struct {
		name string
		op   func(i int) error
	}
	cycle := func(noInline bool) func(i int) error {
		return func(i int) error {
			d.testNoInline = noInline
			l := lockFor(b, fmt.Sprintf("%s/%d-%v", key, i, noInline))
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			g, err := acquire(cctx, d, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(cctx, l)
		}
	}
	floor, _ := measure.RawFloor(d)
	subs := []sub{
		{"floor", func(i int) error { return floor(ctx, fmt.Sprintf("f%d", i)) }},
		{"inline", cycle(false)},
		{"aside", cycle(true)},
	}
	ops := make([]func(int) error, len(subs))
	for k, sb := range subs {
		ops[k] = sb.op
	}
	b.ResetTimer()
	med, err := bench.OpByOp(7, max(b.N/7, 50), ops)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	for k := 1; k < len(subs); k++ {
		m, lo, hi := bench.Ratios(med[0], med[k])
		b.ReportMetric(m, subs[k].name+"/floor")
		b.ReportMetric(lo, subs[k].name+"/floor-min")
		b.ReportMetric(hi, subs[k].name+"/floor-max")
	}
	m, lo, hi := bench.Ratios(med[2], med[1])
	b.ReportMetric(m, "inline/aside-ops")
	b.ReportMetric(lo, "inline/aside-min")
	b.ReportMetric(hi, "inline/aside-max")
}

// BenchmarkContendedInline: BenchmarkContended's workload (8 workers, one
// driver each, one name, 1 ms hold), in alternating rounds of 50 with the
// drivers' calls on the callers' goroutines and each on a goroutine of its
// own (as before calls ran inline). inline/aside-acq/s is the median, least
// and greatest over the pairs of rounds.
func BenchmarkContendedInline(b *testing.B) {
	servers := testenv.ZKAddrs()
	testenv.Require(b, servers...)
	const workers = 8
	conn := benchConn(b, servers)
	ctx := context.Background()
	key := uniqueKey(b)
	rt := func(context.Context) error { _, _, err := conn.Exists("/"); return err }
	run := bench.Contend{Hold: time.Millisecond, RoundTrip: rt, RoundTripOp: "exists"}
	var ds []*Driver
	for w := range workers {
		d := dial(b, servers)
		ds = append(ds, d)
		run.Workers = append(run.Workers, bench.Worker{Client: w, Acquire: func(ctx context.Context) (func(context.Context) error, error) {
			l := lockFor(b, key)
			if _, err := acquire(ctx, d, l); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return d.Release(ctx, l) }, nil
		}})
	}
	set := func(aside bool) {
		for _, d := range ds {
			d.testNoInline = aside
		}
	}
	run.Acquisitions = 2 * workers
	if _, err := run.Run(ctx); err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 500)
	var in, as *bench.Samples
	var ratios []float64
	b.ResetTimer()
	for done := 0; done < n; done += 50 {
		run.Acquisitions = 50
		var pair [2]*bench.Samples
		// Which goes first alternates.
		for _, aside := range []bool{done%100 == 0, done%100 != 0} {
			set(aside)
			s, err := run.Run(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if aside {
				pair[1] = s
			} else {
				pair[0] = s
			}
		}
		ratios = append(ratios, pair[0].Summary().AcquisitionsSec/pair[1].Summary().AcquisitionsSec)
		if in == nil {
			in, as = pair[0], pair[1]
		} else {
			in.Add(pair[0])
			as.Add(pair[1])
		}
	}
	b.StopTimer()
	set(false)
	in.Summary().Report(b, "inline")
	as.Summary().Report(b, "aside")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "inline/aside-acq/s")
	b.ReportMetric(ratios[0], "inline/aside-acq/s-min")
	b.ReportMetric(ratios[len(ratios)-1], "inline/aside-acq/s-max")
}
