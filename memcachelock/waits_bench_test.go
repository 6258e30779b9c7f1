package memcachelock

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkWaits: 2 drivers (made by Open, as two processes would have),
// 4 workers on each, take one name in turn, each holding it 1ms, then
// 5ms, for 2s after a warm-up of 0.5s (run it with -benchtime 1x).
// Besides the contended figures it reports each worker's wait, Acquire
// call to return: p50, p99 and the longest (how long the unluckiest
// waiter waited: unfairness between drivers shows there first), and the
// TryAcquire calls per acquisition.
func BenchmarkWaits(b *testing.B) {
	for _, hold := range []time.Duration{time.Millisecond, 5 * time.Millisecond} {
		b.Run("hold="+hold.String(), func(b *testing.B) { benchWaits(b, hold) })
	}
}

func benchWaits(b *testing.B, hold time.Duration) {
	testenv.Require(b, testenv.MemcacheAddr())
	ns := "mctest-" + randHex(4)
	const warmup = 500 * time.Millisecond
	run := bench.Contend{Hold: hold, Duration: 2 * time.Second, Warmup: warmup, RoundTripOp: "get"}
	tries := new(atomic.Int64)
	for i := range 2 {
		d := openDriver(b, testenv.MemcacheAddr())
		c, err := locker.New(tryCounting{d, tries}, locker.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		if i == 0 {
			run.RoundTrip = missRoundTrip(d, ns)
		}
		for range 4 {
			run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, "waits")})
		}
	}
	var tries0 atomic.Int64
	run.Start = time.Now()
	warm := time.AfterFunc(warmup, func() { tries0.Store(tries.Load()) })
	defer warm.Stop()
	s := run.RunB(b)
	b.ReportMetric(float64(tries.Load()-tries0.Load())/float64(s.Acquisitions), "tries/acq")
	s.Summary().Report(b, "")
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(bench.Percentile(s.Waits, 0.5)), "wait-p50-µs")
	b.ReportMetric(us(slices.Max(s.Waits)), "wait-max-µs")
}
