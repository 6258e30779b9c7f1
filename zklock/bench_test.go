package zklock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
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

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func ensurePath(b *testing.B, conn *zk.Conn, path string) {
	if _, err := conn.Create(path, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
}

// BenchmarkUncontended: acquire and release, nobody else around, on a name
// used before (its parent exists) and on a fresh one. Metrics: microseconds
// per acquire+release for each, and zklock's time over zk.Lock's.
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
		if _, err := d.Acquire(ctx, l); err != nil {
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
	var oursKnown, theirsKnown, oursFresh, theirsFresh []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		oursKnown = append(oursKnown, ours(known))
		theirsKnown = append(theirsKnown, theirs(zkKnown))
		oursFresh = append(oursFresh, ours(fmt.Sprintf("%s/%d", known, i)))
		theirsFresh = append(theirsFresh, theirs(zk.NewLock(conn, fmt.Sprintf("%s/fresh-%d", run, i), zk.WorldACL(zk.PermAll))))
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
// name. The handoff is the time from a holder's release call to the next
// holder's grant. Metrics: median handoff for each, and over the RTT.
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
	ds := make([]*Driver, workers)
	conns := make([]*zk.Conn, workers)
	for i := range workers {
		ds[i] = dial(b, servers)
		conns[i] = benchConn(b, servers)
	}

	// contend runs n turns of acquire/release in total and returns the
	// handoffs.
	contend := func(n int, acquire func(w int) (release func())) []time.Duration {
		var (
			mu        sync.Mutex
			handoffs  []time.Duration
			left      atomic.Int64
			releasing atomic.Int64 // when the last release began, unix ns; 0 after a grant
			wg        sync.WaitGroup
		)
		left.Store(int64(n))
		for w := range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					release := acquire(w)
					now := time.Now().UnixNano()
					if r := releasing.Swap(0); r != 0 {
						mu.Lock()
						handoffs = append(handoffs, time.Duration(now-r))
						mu.Unlock()
					}
					releasing.Store(time.Now().UnixNano())
					release()
				}
			})
		}
		wg.Wait()
		return handoffs
	}
	ours := func(w int) func() {
		l := lockFor(b, key)
		if _, err := ds[w].Acquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		return func() {
			if err := ds[w].Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	}
	zkLocks := make([]*zk.Lock, workers)
	for w := range workers {
		zkLocks[w] = zk.NewLock(conns[w], run+"/contended", zk.WorldACL(zk.PermAll))
	}
	theirs := func(w int) func() {
		if err := zkLocks[w].Lock(); err != nil {
			b.Fatal(err)
		}
		return func() {
			if err := zkLocks[w].Unlock(); err != nil {
				b.Fatal(err)
			}
		}
	}
	contend(workers, ours)
	contend(workers, theirs)
	n := max(b.N, 2*workers)
	b.ResetTimer()
	var oh, th, rtts, floors []time.Duration
	// Alternate in rounds, so that both, and the round trips, see the
	// same load.
	for done := 0; done < n; done += 50 {
		k := min(50, n-done)
		oh = append(oh, contend(k, ours)...)
		th = append(th, contend(k, theirs)...)
		for range 20 {
			start := time.Now()
			if _, _, err := conn.Exists("/"); err != nil {
				b.Fatal(err)
			}
			rtts = append(rtts, time.Since(start))
		}
		floors = append(floors, floor(b, conns[0], conns[1], run))
	}
	b.StopTimer()
	r := median(rtts)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	om, tm := median(oh), median(th)
	b.ReportMetric(us(r), "rtt-µs")
	b.ReportMetric(us(writeRTT(b, conn, run)), "write-rtt-µs")
	b.ReportMetric(us(om), "zklock-handoff-µs")
	b.ReportMetric(us(tm), "zkLock-handoff-µs")
	b.ReportMetric(float64(om)/float64(r), "zklock-handoff/rtt")
	b.ReportMetric(us(median(floors)), "floor-µs")
	b.ReportMetric(float64(tm)/float64(r), "zkLock-handoff/rtt")
	cleanup(conn, run)
}
