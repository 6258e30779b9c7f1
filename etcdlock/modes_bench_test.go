package etcdlock

import (
	"context"
	"fmt"
	"sync"
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

// BenchmarkContendedPermits: 16 workers on 2 clients take permits of one
// semaphore of limit 4, each holding it 1ms; b.N permits in all. It
// reports permits/s, the wait's p50 and p99, and the most holders seen at
// once (which must not pass the limit).
//
//	go test -run '^$' -bench ContendedPermits -benchtime 400x ./etcdlock
func BenchmarkContendedPermits(b *testing.B) {
	const limit, workers = 4, 16
	prefix := fmt.Sprintf("/locker-bench/%d", time.Now().UnixNano())
	var cs []*locker.Client
	for range 2 {
		c, err := locker.New(mustNew(b, benchClient(b), WithPrefix(prefix)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	ctx := context.Background()
	var (
		mu           sync.Mutex
		left         = b.N
		inside, most int
		waits        []time.Duration
		wg           sync.WaitGroup
		errs         = make(chan error, workers)
	)
	b.ResetTimer()
	start := time.Now()
	for i := range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				if left == 0 {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				asked := time.Now()
				l, err := cs[i%2].Acquire(ctx, "bench", locker.Semaphore(limit))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				waits = append(waits, time.Since(asked))
				inside++
				most = max(most, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if most > limit {
		b.Fatalf("%d holders at once, limit %d", most, limit)
	}
	b.ReportMetric(float64(b.N)/took.Seconds(), "permits/s")
	b.ReportMetric(float64(bench.Percentile(waits, 0.5))/1e3, "wait-p50-µs")
	b.ReportMetric(float64(bench.Percentile(waits, 0.99))/1e3, "wait-p99-µs")
	b.ReportMetric(float64(most), "most-inside")
}
