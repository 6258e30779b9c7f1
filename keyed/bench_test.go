package keyed_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/keyed"
)

const (
	benchKeys    = 1000
	benchTasks   = 10 // per key, half from each of the 2 processes
	benchWorkers = 16 // Do's workers per process, and the Executor's Concurrency
)

// benchOrder counts, per process and key, the tasks that ran before one
// submitted earlier.
type benchOrder struct {
	mu   sync.Mutex
	last map[[2]int]int
	ooo  int
}

func (o *benchOrder) ran(proc, key, i int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := [2]int{proc, key}
	if last, ok := o.last[k]; ok && i < last {
		o.ooo++
	}
	o.last[k] = max(i, o.last[k])
}

// BenchmarkKeyed does 1,000 keys × 10 tasks over 2 Clients, as two
// processes, each receiving 5 tasks of every key as one stream (key 0..999,
// 5 rounds): "keyed" through an Executor per process, "do" with Client.Do
// per task on 16 workers per process. One op is the whole workload.
func BenchmarkKeyed(b *testing.B) {
	for _, tg := range targets() {
		if tg.name != "mem" && tg.name != "redis" && tg.name != "redis-fair" {
			continue
		}
		b.Run(tg.name, func(b *testing.B) {
			if len(tg.addrs) > 0 {
				testenv.Require(b, tg.addrs...)
			}
			raw := tg.url(b)
			c1, c2 := open(b, raw), open(b, raw)
			clients := []*locker.Client{c1, c2}
			b.Run("keyed", func(b *testing.B) { benchKeyed(b, clients) })
			b.Run("do", func(b *testing.B) { benchDo(b, clients) })
		})
	}
}

func benchKeyed(b *testing.B, clients []*locker.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var acq, ooo int64
	for b.Loop() {
		order := &benchOrder{last: map[[2]int]int{}}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for p, c := range clients {
			ex := keyed.New(c, keyed.Concurrency(benchWorkers))
			wg.Go(func() {
				results := make([]<-chan error, 0, benchKeys*benchTasks/2)
				for i := range benchTasks / 2 {
					for k := range benchKeys {
						results = append(results, ex.Go(ctx, fmt.Sprint("k", k), func(context.Context) error {
							order.ran(p, k, i)
							return nil
						}))
					}
				}
				for _, r := range results {
					if <-r != nil {
						failed.Add(1)
					}
				}
				ex.Close()
				atomic.AddInt64(&acq, ex.Stats().Acquisitions)
			})
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d tasks failed", n)
		}
		ooo += int64(order.ooo)
	}
	report(b, acq, ooo)
}

func benchDo(b *testing.B, clients []*locker.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var acq, ooo int64
	for b.Loop() {
		order := &benchOrder{last: map[[2]int]int{}}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for p, c := range clients {
			work := make(chan [2]int)
			for range benchWorkers {
				wg.Go(func() {
					for w := range work {
						k, i := w[0], w[1]
						err := c.Do(ctx, fmt.Sprint("k", k), func(context.Context) error {
							order.ran(p, k, i)
							return nil
						})
						if err != nil {
							failed.Add(1)
						}
						atomic.AddInt64(&acq, 1)
					}
				})
			}
			wg.Go(func() {
				defer close(work)
				for i := range benchTasks / 2 {
					for k := range benchKeys {
						work <- [2]int{k, i}
					}
				}
			})
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d tasks failed", n)
		}
		ooo += int64(order.ooo)
	}
	report(b, acq, ooo)
}

func report(b *testing.B, acq, ooo int64) {
	tasks := float64(benchKeys * benchTasks * b.N)
	b.ReportMetric(tasks/b.Elapsed().Seconds(), "tasks/s")
	b.ReportMetric(float64(acq)/float64(b.N), "locks/op")
	b.ReportMetric(float64(ooo)/float64(b.N), "out-of-order/op")
}
