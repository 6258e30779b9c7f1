package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// rwShare: readers share; a writer excludes readers and writers; the lock
// of the same name is another object.
func (s *suite) rwShare(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	needMode(t, c1, backend.Write)
	name := s.name(t, "x")
	r1 := mustAcquire(t, ctx, c1, name, locker.Read())
	r2 := mustAcquire(t, ctx, c2, name, locker.Read())
	mustRefuse(t, ctx, c3, name, "two readers hold it", locker.Write())
	mustRelease(t, ctx, r1)
	mustRefuse(t, ctx, c3, name, "a reader holds it", locker.Write())
	mustRelease(t, ctx, r2)
	w := mustAcquire(t, ctx, c3, name, locker.Write())
	mustRefuse(t, ctx, c1, name, "a writer holds it", locker.Read())
	mustRefuse(t, ctx, c2, name, "a writer holds it", locker.Write())
	mustRelease(t, ctx, mustAcquire(t, ctx, c1, name)) // the lock is not the read-write lock
	mustRelease(t, ctx, w)
	mustRelease(t, ctx, mustAcquire(t, ctx, c1, name, locker.Read()))
}

// rwCounter: readers and writers from 8 goroutines on each of 2 clients:
// a writer is always alone, readers are together at times.
func (s *suite) rwCounter(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	needMode(t, cs[0], backend.Write)
	name := s.name(t, "x")
	const workers, rounds = 16, 4
	var readers, writers, mostReaders atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		write := w%4 == 0
		wg.Go(func() {
			for r := range rounds {
				opt := locker.Read()
				if write {
					opt = locker.Write()
				}
				err := cs[(w+r)%2].Do(ctx, name, func(context.Context) error {
					if write {
						defer writers.Add(-1)
						if n, m := writers.Add(1), readers.Load(); n != 1 || m != 0 {
							t.Errorf("a writer is inside with %d writers and %d readers", n, m)
						}
					} else {
						defer readers.Add(-1)
						n := readers.Add(1)
						if m := writers.Load(); m != 0 {
							t.Errorf("a reader is inside with %d writers", m)
						}
						for m := mostReaders.Load(); n > m && !mostReaders.CompareAndSwap(m, n); m = mostReaders.Load() {
						}
						togetherOnce(&mostReaders)
					}
					time.Sleep(5 * time.Millisecond)
					return nil
				}, opt)
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("at most %d readers at once", mostReaders.Load())
	if mostReaders.Load() < 2 {
		t.Errorf("never more than %d reader at once: readers do not share", mostReaders.Load())
	}
}

// rwNotStarved: a writer gets in while readers keep coming, each arriving
// before the last one leaves, so that some reader always holds the lock.
func (s *suite) rwNotStarved(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	wc := s.client(t)
	needMode(t, wc, backend.Write)
	name := s.name(t, "x")
	const hold = 150 * time.Millisecond
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for i := range 4 {
		wg.Go(func() {
			c := cs[i%2]
			time.Sleep(time.Duration(i) * hold / 4)
			l, err := c.Acquire(ctx, name, locker.Read())
			for n := 0; err == nil && n < 1000; n++ {
				reads.Add(1)
				select {
				case <-stop:
					l.Release(ctx)
					return
				case <-time.After(hold):
				}
				// The next read is taken before this one goes, so that
				// however late this goroutine runs, the stream leaves no
				// gap: only a waiting writer holds it back (refused, or
				// queued behind the writer).
				next, terr := c.Acquire(ctx, name, locker.Read(), locker.WaitAtMost(hold))
				l.Release(ctx)
				if terr != nil {
					next, err = c.Acquire(ctx, name, locker.Read())
				}
				l = next
			}
			if err != nil {
				t.Errorf("reader: %v", err)
				return
			}
			l.Release(ctx)
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(2 * hold) // the stream is flowing
	bound := 10 * time.Second
	start := time.Now()
	w, err := wc.Acquire(ctx, name, locker.Write(), locker.WaitAtMost(bound))
	if err != nil {
		t.Fatalf("a writer did not get in within %v of a stream of readers (%d reads): %v", bound, reads.Load(), err)
	}
	t.Logf("the writer got in %v after it asked, through a stream of readers", time.Since(start))
	mustRelease(t, ctx, w)
}

// rwFences: a writer's fence is above every earlier reader's and writer's;
// a reader's above the writer before it.
func (s *suite) rwFences(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	needMode(t, c1, backend.Write)
	name := s.name(t, "x")
	r1 := mustAcquire(t, ctx, c1, name, locker.Read())
	if r1.Fence() == 0 {
		mustRelease(t, ctx, r1)
		t.Skip("the driver issues no fencing tokens (Grant.Fence 0)")
	}
	r2 := mustAcquire(t, ctx, c2, name, locker.Read())
	if r2.Fence() <= r1.Fence() {
		t.Fatalf("reader fences %d then %d: must increase", r1.Fence(), r2.Fence())
	}
	mustRelease(t, ctx, r1)
	mustRelease(t, ctx, r2)
	w := mustAcquire(t, ctx, c1, name, locker.Write())
	if w.Fence() <= r2.Fence() {
		t.Fatalf("writer fence %d, not above the readers' %d and %d", w.Fence(), r1.Fence(), r2.Fence())
	}
	mustRelease(t, ctx, w)
	r3 := mustAcquire(t, ctx, c2, name, locker.Read())
	if r3.Fence() <= w.Fence() {
		t.Fatalf("reader fence %d after writer fence %d: must increase", r3.Fence(), w.Fence())
	}
	mustRelease(t, ctx, r3)
	w2 := mustAcquire(t, ctx, c2, name, locker.Write())
	if w2.Fence() <= r3.Fence() {
		t.Fatalf("writer fence %d after reader fence %d: must increase", w2.Fence(), r3.Fence())
	}
	mustRelease(t, ctx, w2)
}

// rwCancel: a writer that stops waiting leaves nothing that holds readers
// back.
func (s *suite) rwCancel(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	needMode(t, c1, backend.Write)
	name := s.name(t, "x")
	r := mustAcquire(t, ctx, c1, name, locker.Read())
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c2.Acquire(dctx, name, locker.Write())
	cancel()
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Acquire past its deadline = %v, want ErrNotAcquired", err)
	}
	if _, err := c2.TryAcquire(ctx, name, locker.Write()); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the write side with a reader = %v, want ErrNotAcquired", err)
	}
	// At once: a record of the writer left behind would refuse readers.
	mustRelease(t, ctx, mustAcquire(t, ctx, c3, name, locker.Read()))
	mustRelease(t, ctx, r)
	if wc, ok := s.h.(WaiterCounter); ok {
		if n, err := wc.Entries(ctx, s.key(name)); err != nil || n != 0 {
			t.Fatalf("after release, the store has %d entries for the key (err %v), want 0", n, err)
		}
	}
}

// rwWakes: a writer waiting for a reader, and a reader waiting for a
// writer, get in soon after the release.
func (s *suite) rwWakes(t *testing.T) {
	ctx := s.ctx(t)
	c1 := s.client(t)
	needMode(t, c1, backend.Write)
	name := s.name(t, "x")
	s.wakes(t, ctx, name, mustAcquire(t, ctx, c1, name, locker.Read()), locker.Write())
	s.wakes(t, ctx, name, mustAcquire(t, ctx, c1, name, locker.Write()), locker.Read())
}

func (s *suite) rwForged(t *testing.T) {
	s.forgedShared(t, backend.Read, locker.Read(), locker.Write(), 0)
}

func (s *suite) rwCutHolder(t *testing.T) { s.cutHolderLoses(t, backend.Write, locker.Write()) }
