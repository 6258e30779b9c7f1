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
// processes, each receiving 5 tasks of every key as one stream: "rounds"
// sends key 0..999 five times, "grouped" a key's 5 tasks one after
// another. "keyed" runs them through an Executor per process, "do" with
// Client.Do per task on 16 workers per process. One op is the whole
// workload; out-of-order counts tasks that ran before a task of their key
// sent earlier to their process.
func BenchmarkKeyed(b *testing.B) {
	layouts := []struct {
		name   string
		stream [][2]int // key, index
	}{{"rounds", nil}, {"grouped", nil}}
	for i := range benchTasks / 2 {
		for k := range benchKeys {
			layouts[0].stream = append(layouts[0].stream, [2]int{k, i})
		}
	}
	for k := range benchKeys {
		for i := range benchTasks / 2 {
			layouts[1].stream = append(layouts[1].stream, [2]int{k, i})
		}
	}
	for _, tg := range targets() {
		b.Run(tg.name, func(b *testing.B) {
			if len(tg.addrs) > 0 {
				testenv.Require(b, tg.addrs...)
			}
			raw := tg.url(b)
			c1, c2 := open(b, raw), open(b, raw)
			clients := []*locker.Client{c1, c2}
			for _, l := range layouts {
				b.Run(l.name+"/keyed", func(b *testing.B) { benchKeyed(b, clients, l.stream) })
				b.Run(l.name+"/do", func(b *testing.B) { benchDo(b, clients, l.stream) })
			}
		})
	}
}

func benchKeyed(b *testing.B, clients []*locker.Client, stream [][2]int) {
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
				results := make([]<-chan error, 0, len(stream))
				for _, w := range stream {
					k, i := w[0], w[1]
					results = append(results, ex.Go(ctx, fmt.Sprint("k", k), func(context.Context) error {
						order.ran(p, k, i)
						return nil
					}))
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

func benchDo(b *testing.B, clients []*locker.Client, stream [][2]int) {
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
				for _, w := range stream {
					work <- w
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
