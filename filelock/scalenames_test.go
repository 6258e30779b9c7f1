package filelock

import (
	"context"
	"testing"

	"github.com/lockerhq/locker/internal/bench"
)

// BenchmarkScaleNames runs lockctl bench's names workload for its CPU
// profile. Run it with -benchtime 1x.
func BenchmarkScaleNames(b *testing.B) {
	for range b.N {
		s, err := bench.RunNames(context.Background(), "file", "file://"+b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		s.Report(b.ReportMetric)
	}
}
