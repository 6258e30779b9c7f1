package etcdlock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/bench"
)

// BenchmarkUncontendedModes interleaves an uncontended acquire+release
// of a lock, a permit (limit 4), a reader and a writer of one name, as
// BenchmarkUncontended does its contenders, and reports each one's median
// cycle and its ratio to the lock's:
//
//	go test -run '^$' -bench UncontendedModes -benchtime 3s ./etcdlock
func BenchmarkUncontendedModes(b *testing.B) {
	c, err := locker.New(mustNew(b, benchClient(b), WithPrefix(fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano()))))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	kinds := []struct {
		name string
		opts []locker.LockOption
	}{
		{"lock", nil},
		{"permit", []locker.LockOption{locker.Semaphore(4)}},
		{"read", []locker.LockOption{locker.Read()}},
		{"write", []locker.LockOption{locker.Write()}},
	}
	ctx := context.Background()
	times := make([][]time.Duration, len(kinds))
	b.ResetTimer()
	for n := range b.N {
		for k := range kinds {
			i := (n + k) % len(kinds) // rotate, so that no one always goes first
			start := time.Now()
			l, err := c.Acquire(ctx, "bench", kinds[i].opts...)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			times[i] = append(times[i], time.Since(start))
		}
	}
	b.StopTimer()
	lock := float64(bench.Percentile(times[0], 0.5))
	for i, k := range kinds {
		med := float64(bench.Percentile(times[i], 0.5))
		b.ReportMetric(med/1e6, k.name+"-ms")
		if i > 0 {
			b.ReportMetric(med/lock, k.name+"/lock")
		}
	}
}
