package memcachelock

import (
	"context"
	"testing"

	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkScaleNames runs lockctl bench's names workload for its CPU
// profile. Run it with -benchtime 1x.
func BenchmarkScaleNames(b *testing.B) {
	testenv.Require(b, testenv.MemcacheAddr())
	for range b.N {
		s, err := bench.RunNames(context.Background(), "memcache", "memcache://"+testenv.MemcacheAddr())
		if err != nil {
			b.Fatal(err)
		}
		s.Report(b.ReportMetric)
	}
}
