package locker_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

// BenchmarkAcquireRelease is one uncontended lock cycle on memlock, in
// memory, so nearly all of it is the Client's own work: alone, and from
// parallel goroutines on distinct names through one Client, where the
// Client's CPU per cycle (cpu-ns/op, user+system from getrusage) decides
// throughput.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nop := func(context.Context) error { return nil }
	cycles := []struct {
		name  string
		cycle func(c *locker.Client, name string) error
	}{
		{"TryAcquire", func(c *locker.Client, name string) error {
			l, err := c.TryAcquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"Acquire", func(c *locker.Client, name string) error {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		// A caller's context that can end (a request's): the Client's
		// gate gives the call a context of its own.
		{"TryAcquireCancel", func(c *locker.Client, name string) error {
			l, err := c.TryAcquire(cctx, name)
			if err != nil {
				return err
			}
			return l.Release(cctx)
		}},
		{"Do", func(c *locker.Client, name string) error { return c.Do(ctx, name, nop) }},
		// LockDelay adds no request and should add nothing measurable:
		// against TryAcquire.
		{"LockDelay", func(c *locker.Client, name string) error {
			l, err := c.TryAcquire(ctx, name, locker.LockDelay(time.Minute))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"NoAutoRefresh", func(c *locker.Client, name string) error {
			l, err := c.TryAcquire(ctx, name, locker.AutoRefresh(false))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
	}
	for _, cy := range cycles {
		b.Run(cy.name, func(b *testing.B) {
			c := newClient(b, memlock.NewStore())
			b.ReportAllocs()
			for b.Loop() {
				if err := cy.cycle(c, "x"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(cy.name+"/parallel", func(b *testing.B) {
			c := newClient(b, memlock.NewStore())
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8) // 8 goroutines per CPU: 16 on a 2-core machine
			cpu := cpuTime(b)
			b.RunParallel(func(pb *testing.PB) {
				name := "x" + strconv.FormatInt(next.Add(1), 10)
				for pb.Next() {
					if err := cy.cycle(c, name); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// A blocking Acquire of a free lock costs what TryAcquire does: no
// turnstile, subscription or timer before its first try.
func TestUncontendedAcquireAllocatesAsTryAcquire(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	cycle := func(acquire func(context.Context, string, ...locker.LockOption) (*locker.Lock, error)) float64 {
		return testing.AllocsPerRun(200, func() {
			l, err := acquire(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	if try, acq := cycle(c.TryAcquire), cycle(c.Acquire); acq > try {
		t.Fatalf("Acquire+Release: %v allocations, TryAcquire+Release: %v", acq, try)
	}
}

// BenchmarkLockSet is an uncontended cycle of a set of 4 names on memlock
// (one request each way): against BenchmarkAcquireRelease/TryAcquire, what
// the Client spends on a set.
func BenchmarkLockSet(b *testing.B) {
	ctx := context.Background()
	c := newClient(b, memlock.NewStore())
	names := []string{"a", "b", "c", "d"}
	b.ReportAllocs()
	for b.Loop() {
		s, err := c.TryAcquireAll(ctx, names)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
