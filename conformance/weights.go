package conformance

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// needWeights skips a case on a backend that takes one permit per claim.
func needWeights(t *testing.T, c *locker.Client) {
	t.Helper()
	needMode(t, c, backend.Permit)
	if w, ok := backend.As[backend.Weigher](c.Driver()); !ok || !w.Weighs() {
		t.Skip("the backend takes one permit per claim (backend.Weigher)")
	}
}

// semWeightsAtMostLimit: claims of 1 to 3 permits race on 2 clients for a
// semaphore of 5; the permits held, counted by the holders themselves,
// never exceed 5, and reach 4 at times (two holders share it: a weight is
// not counted for more than it is).
func (s *suite) semWeightsAtMostLimit(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	needWeights(t, cs[0])
	name := s.name(t, "x")
	const limit, workers, rounds = 5, 12, 4
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		weight := 1 + w%3
		wg.Go(func() {
			for range rounds {
				err := cs[w%2].Do(ctx, name, func(context.Context) error {
					n := inside.Add(int64(weight))
					defer inside.Add(-int64(weight))
					if n > limit {
						t.Errorf("%d permits held of a semaphore of %d", n, limit)
					}
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					for end := time.Now().Add(100 * time.Millisecond); most.Load() < limit-1 && time.Now().Before(end); {
						time.Sleep(time.Millisecond)
					}
					time.Sleep(5 * time.Millisecond)
					return nil
				}, locker.Semaphore(limit), locker.Permits(weight))
				if err != nil {
					t.Errorf("Do with %d permits: %v", weight, err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("at most %d of %d permits held at once", most.Load(), limit)
	if most.Load() < limit-1 {
		t.Errorf("never more than %d of %d permits held at once by claims of 1 to 3: weights are counted for more than they are", most.Load(), limit)
	}
}

// semWeightsRefused: a claim of more permits than are free is refused
// while a lighter one fits, all or nothing; a claim of the whole limit
// fits an empty semaphore.
func (s *suite) semWeightsRefused(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	needWeights(t, c1)
	name := s.name(t, "x")
	sem := locker.Semaphore(5)
	a := mustAcquire(t, ctx, c1, name, sem, locker.Permits(3))
	mustRefuse(t, ctx, c2, name, "3 of 5 permits are held: 3 more do not fit", sem, locker.Permits(3))
	b := mustAcquire(t, ctx, c2, name, sem, locker.Permits(2))
	mustRefuse(t, ctx, c3, name, "all 5 permits are held", sem)
	mustRelease(t, ctx, a)
	c := mustAcquire(t, ctx, c3, name, sem, locker.Permits(3))
	mustRelease(t, ctx, b)
	mustRelease(t, ctx, c)
	mustRelease(t, ctx, mustAcquire(t, ctx, c1, name, sem, locker.Permits(5)))
}

// semWeightsFIFO: where the store queues, a waiting claim of 2 permits of
// 3, with 1 free, is not overtaken by a claim of 1 behind it; a release
// lets both in.
func (s *suite) semWeightsFIFO(t *testing.T) {
	if !s.tr.FIFO.Has(backend.Permit) {
		t.Skip("the harness does not claim FIFO order for semaphores (Traits.FIFO)")
	}
	ctx := s.ctx(t)
	cs, arrived := s.fifoClients(t)
	needWeights(t, cs[0])
	name := s.name(t, "x")
	sem := locker.Semaphore(3)
	keep := mustAcquire(t, ctx, cs[0], name, sem, locker.Permits(2))
	base, counts := s.entries(t, ctx, name)
	type result struct {
		l   *locker.Lock
		err error
	}
	var got [2]chan result
	for i, weight := range []int{2, 1} {
		got[i] = make(chan result, 1)
		go func() {
			l, err := cs[i].Acquire(context.WithValue(ctx, waiterKey{}, i), name, sem, locker.Permits(weight))
			got[i] <- result{l, err}
		}()
		s.queued(t, ctx, arrived, i, name, base+i+1, counts)
	}
	select {
	case r := <-got[1]:
		if r.err == nil {
			r.l.Release(ctx)
		}
		t.Fatalf("a claim of 1 permit, behind a waiting claim of 2 with 1 of 3 free, returned first: %v", r.err)
	default:
	}
	mustRelease(t, ctx, keep)
	for i, ch := range got {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("waiter %d: %v", i, r.err)
			}
			defer mustRelease(t, ctx, r.l)
		case <-time.After(s.slack() + time.Second):
			t.Fatalf("waiter %d not served within %v of the release", i, s.slack()+time.Second)
		}
	}
}
