package memcachelock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkScaleNames runs lockctl bench's names workload (names × 4
// workers over 4 clients, 1ms holds) for its CPU profile: with 1,000
// names every name's workers share one client (1000 is a multiple of 4),
// with 999 they are spread over all four. Run it with -benchtime 1x.
func BenchmarkScaleNames(b *testing.B) {
	for _, names := range []int{1000, 999} {
		b.Run("names="+strconv.Itoa(names), func(b *testing.B) {
			testenv.Require(b, testenv.MemcacheAddr())
			ctx := context.Background()
			open, opts, err := bench.URLOpener(ctx, "memcache://"+testenv.MemcacheAddr())
			if err != nil {
				b.Fatal(err)
			}
			cfg := bench.Defaults
			cfg.Only, cfg.Names, cfg.NameWorkers, cfg.NameClients = []string{"names"}, names, 4, 4
			cfg.Duration = 1500 * time.Millisecond
			for range b.N {
				r := bench.Run(ctx, "memcache", open, opts, cfg)
				s := r.Names
				if s == nil {
					b.Fatalf("no names result: %+v", r)
				}
				b.ReportMetric(s.AcquisitionsSec, "acq/s")
				b.ReportMetric(float64(s.CPUPerAcq.Microseconds()), "cpu-us/acq")
				b.ReportMetric(s.Tries, "tries/acq")
				b.ReportMetric(float64(s.WaitP99.Milliseconds()), "p99-ms")
			}
		})
	}
}
