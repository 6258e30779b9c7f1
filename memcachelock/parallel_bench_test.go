package memcachelock

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkParallel: 16 goroutines, each on its own name, acquire and
// release through one locker.Client, against the raw floor (add, delete)
// on the same driver and connections, in alternating blocks of 100ms
// (one round: floor, client, then the bare driver's TryAcquire and
// Release), so that all see the same machine. Metrics, medians over
// rounds: x-floor (the client's cycles/s over the floor's, per round; -min
// and -max its range; driver-x-floor the driver's), cpu-us (this process's
// CPU per cycle; floor-, driver-), srv-us (memcached's CPU per cycle, from
// its rusage stats), cmds (memcached commands per cycle, a multi-key get
// counting one per key).
func BenchmarkParallel(b *testing.B) {
	testenv.Require(b, testenv.MemcacheAddr())
	const (
		workers = 16
		block   = 100 * time.Millisecond
	)
	d := openDriver(b, testenv.MemcacheAddr())
	c, err := locker.New(d, locker.WithNamespace("mctest-"+randHex(4)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	floor, _ := measure.RawFloor(d)
	ctx := context.Background()
	run := func(f func(i int) error) (n int64, cpu, srv time.Duration, cmds int64) {
		var wg sync.WaitGroup
		var count atomic.Int64
		s0, c0 := serverStats(b), cpuNow()
		end := time.Now().Add(block)
		for i := range workers {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := f(i); err != nil {
						b.Error(err)
						return
					}
					count.Add(1)
				}
			})
		}
		wg.Wait()
		c1, s1 := cpuNow(), serverStats(b)
		return count.Load(), c1 - c0, s1.cpu - s0.cpu, s1.cmds - s0.cmds
	}
	floorOp := func(i int) error { return floor(ctx, "floor-"+strconv.Itoa(i)) }
	clientOp := func(i int) error {
		l, err := c.TryAcquire(ctx, "par-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	driverOp := func(i int) error {
		l := backend.Claim{Key: "mctest-par/" + strconv.Itoa(i), Token: token(), TTL: 6 * time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			return err
		}
		return d.Release(ctx, l)
	}
	run(floorOp) // warm the connections
	run(clientOp)
	var ratios, dratios, fcpu, ccpu, dcpu, fsrv, csrv, fcmd, ccmd []float64
	b.ResetTimer()
	for b.Loop() {
		nf, cf, sf, mf := run(floorOp)
		nc, cc, sc, mc := run(clientOp)
		nd, cd, _, _ := run(driverOp)
		ratios = append(ratios, float64(nc)/float64(nf))
		dratios = append(dratios, float64(nd)/float64(nf))
		dcpu = append(dcpu, float64(cd.Microseconds())/float64(nd))
		fcpu = append(fcpu, float64(cf.Microseconds())/float64(nf))
		ccpu = append(ccpu, float64(cc.Microseconds())/float64(nc))
		fsrv = append(fsrv, float64(sf.Microseconds())/float64(nf))
		csrv = append(csrv, float64(sc.Microseconds())/float64(nc))
		fcmd = append(fcmd, float64(mf)/float64(nf))
		ccmd = append(ccmd, float64(mc)/float64(nc))
	}
	b.ReportMetric(median(ratios), "x-floor")
	b.ReportMetric(minOf(ratios), "x-floor-min")
	b.ReportMetric(maxOf(ratios), "x-floor-max")
	b.ReportMetric(median(dratios), "driver-x-floor")
	b.ReportMetric(median(dcpu), "driver-cpu-us")
	b.ReportMetric(median(ccpu), "cpu-us")
	b.ReportMetric(median(fcpu), "floor-cpu-us")
	b.ReportMetric(median(csrv), "srv-us")
	b.ReportMetric(median(fsrv), "floor-srv-us")
	b.ReportMetric(median(ccmd), "cmds")
	b.ReportMetric(median(fcmd), "floor-cmds")
	b.ReportMetric(0, "ns/op")
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// cpuNow is this process's user and system CPU time so far.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type srvStats struct {
	cpu  time.Duration
	cmds int64
}

// serverStats reads memcached's CPU time (rusage_user, rusage_system)
// and its count of commands (cmd_* and the incr, decr and delete counts)
// so far.
func serverStats(b *testing.B) srvStats {
	c, err := net.Dial("tcp", testenv.MemcacheAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		b.Fatal(err)
	}
	var st srvStats
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			b.Fatal(err)
		}
		f := strings.Fields(line)
		if len(f) == 1 && f[0] == "END" {
			return st
		}
		if len(f) != 3 {
			continue
		}
		switch name, v := f[1], f[2]; {
		case name == "rusage_user" || name == "rusage_system":
			x, _ := strconv.ParseFloat(v, 64)
			st.cpu += time.Duration(x * float64(time.Second))
		case strings.HasPrefix(name, "cmd_") || name == "incr_misses" || name == "incr_hits" || name == "delete_misses" || name == "delete_hits" || name == "decr_misses" || name == "decr_hits":
			n, _ := strconv.ParseInt(v, 10, 64)
			st.cmds += n
		}
	}
}
