package conformance

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// needMode skips a case whose mode the backend does not take.
func needMode(t *testing.T, c *locker.Client, m backend.Mode) {
	t.Helper()
	md, ok := backend.As[backend.Modal](c.Driver())
	if !ok || !md.Modes().Has(m) {
		t.Skipf("the backend takes no %s claims (backend.Modal)", m)
	}
}

// semAtMostLimit: 8 goroutines on each of 2 clients share a semaphore of
// 3; never more than 3 are inside, and more than one is at times, or it
// is a mutex.
func (s *suite) semAtMostLimit(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	needMode(t, cs[0], backend.Permit)
	name := s.name(t, "x")
	const limit, workers, rounds = 3, 16, 4
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range rounds {
				err := cs[w%2].Do(ctx, name, func(context.Context) error {
					n := inside.Add(1)
					defer inside.Add(-1)
					if n > limit {
						t.Errorf("%d holders of a semaphore of %d at once", n, limit)
					}
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					togetherOnce(&most)
					time.Sleep(5 * time.Millisecond)
					return nil
				}, locker.Semaphore(limit))
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("at most %d inside at once", most.Load())
	if most.Load() < 2 {
		t.Errorf("never more than %d holder of a semaphore of %d with %d workers: it acts as a lock", most.Load(), limit, workers)
	}
}

// togetherOnce stays, up to 100 ms, until most shows two holders inside at
// once: a loaded machine may run the others' grants more than a holder's
// few milliseconds late, and a semaphore (or readers' side) that admits
// several is still shown to, while one that admits one at a time fails.
func togetherOnce(most *atomic.Int64) {
	for end := time.Now().Add(100 * time.Millisecond); most.Load() < 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// semLimit: a full semaphore refuses; a claim under another limit fails
// with ErrLimitMismatch while permits are held, and sets the limit once
// none is; the lock of the same name is another object.
func (s *suite) semLimit(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	needMode(t, c1, backend.Permit)
	name := s.name(t, "x")
	sem := locker.Semaphore(2)
	a := mustAcquire(t, ctx, c1, name, sem)
	b := mustAcquire(t, ctx, c2, name, sem)
	mustRefuse(t, ctx, c3, name, "both permits of a semaphore of 2 are held", sem)
	if l, err := c3.TryAcquire(ctx, name, locker.Semaphore(3)); !errors.Is(err, locker.ErrLimitMismatch) {
		if err == nil {
			l.Release(ctx)
		}
		t.Fatalf("TryAcquire with limit 3 while 2 permits of 2 are held = %v, want ErrLimitMismatch", err)
	}
	// The lock of the same name is not the semaphore.
	mustRelease(t, ctx, mustAcquire(t, ctx, c3, name))
	mustRelease(t, ctx, a)
	c := mustAcquire(t, ctx, c3, name, sem)
	mustRelease(t, ctx, b)
	mustRelease(t, ctx, c)
	// Free again: a new limit holds.
	var ls []*locker.Lock
	for i := range 3 {
		ls = append(ls, mustAcquire(t, ctx, []*locker.Client{c1, c2, c3}[i], name, locker.Semaphore(3)))
	}
	mustRefuse(t, ctx, c1, name, "the 3 permits of a semaphore of 3 are held", locker.Semaphore(3))
	for _, l := range ls {
		mustRelease(t, ctx, l)
	}
}

// cutHolderLoses: a holder cut off from the store (or, with no Outager,
// one that stops refreshing) is told it lost its grant before another
// client gets it, and the store frees it within the TTL and its slack.
func (s *suite) cutHolderLoses(t *testing.T, mode backend.Mode, opt locker.LockOption) {
	ctx := s.ctx(t)
	c2 := s.client(t)
	needMode(t, c2, mode)
	name := s.name(t, "x")
	var c1 *locker.Client
	var down func(bool)
	auto := locker.AutoRefresh(true)
	if o, ok := s.h.(Outager); ok {
		drv, cut, err := o.NewCutDriver(ctx)
		if err != nil {
			t.Fatalf("NewCutDriver: %v", err)
		}
		c, err := locker.New(wrapped{drv}, locker.WithNamespace(s.ns), locker.WithDefaultTTL(s.ttl()))
		if err != nil {
			drv.Close()
			t.Fatalf("locker.New: %v", err)
		}
		t.Cleanup(func() { cut(false); c.Close() })
		c1, down = c, cut
	} else {
		if s.isSession(c2) {
			t.Skip("a session keeps the grant while its client lives, and the harness cannot cut one off (Outager)")
		}
		c1, down, auto = s.client(t), func(bool) {}, locker.AutoRefresh(false)
	}
	start := time.Now()
	l := mustAcquire(t, ctx, c1, name, opt, auto)
	down(true)
	giveUp := start.Add(max(l.TTL(), s.ttl()) + s.slack() + s.ttl())
	for {
		l2, err := c2.TryAcquire(ctx, name, opt)
		if err == nil {
			took := time.Since(start)
			if l.Err() == nil {
				t.Fatalf("another client got it %v after the holder was cut off (TTL %v) while the holder had not been told it was lost", took, l.TTL())
			}
			t.Logf("taken over %v after the cut", took)
			mustRelease(t, ctx, l2)
			return
		}
		if !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire: %v", err)
		}
		if time.Now().After(giveUp) {
			t.Fatalf("not freed within %v of the cut", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *suite) semCutHolder(t *testing.T) { s.cutHolderLoses(t, backend.Permit, locker.Semaphore(1)) }

// forgedShared: Release and Refresh with a token that holds nothing change
// nothing, whatever the mode.
func (s *suite) forgedShared(t *testing.T, mode backend.Mode, hold, probe locker.LockOption, limit int) {
	ctx := s.ctx(t)
	c1, drv := s.clientDriver(t)
	c2 := s.client(t)
	needMode(t, c1, mode)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name, hold)
	forged := backend.Claim{Key: s.key(name), Token: strings.Repeat("0", 32), TTL: s.ttl(), Fence: l.Fence(), Mode: mode, Limit: limit}
	if err := drv.Refresh(ctx, forged); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh with a forged token = %v, want ErrNotHeld", err)
	}
	if err := drv.Release(ctx, forged); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release with a forged token = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, c2, name, "a forged release must not free the holder's grant", probe)
	notLost(t, l)
	mustRelease(t, ctx, l)
}

func (s *suite) semForged(t *testing.T) {
	s.forgedShared(t, backend.Permit, locker.Semaphore(1), locker.Semaphore(1), 1)
}

// semCancel: a wait for a permit that ends without one leaves nothing that
// takes a permit or a place in a queue.
func (s *suite) semCancel(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	needMode(t, c1, backend.Permit)
	name := s.name(t, "x")
	sem := locker.Semaphore(1)
	l := mustAcquire(t, ctx, c1, name, sem)
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c2.Acquire(dctx, name, sem)
	cancel()
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Acquire past its deadline = %v, want ErrNotAcquired", err)
	}
	wc, counts := s.h.(WaiterCounter)
	if counts {
		s.entriesSettle(t, ctx, wc, name, 1, "after a cancelled wait (want the holder's alone)")
	}
	mustRelease(t, ctx, l)
	mustRelease(t, ctx, mustAcquire(t, ctx, c3, name, sem))
	if counts {
		if n, err := wc.Entries(ctx, s.key(name)); err != nil || n != 0 {
			t.Fatalf("after release, the store has %d entries for the key (err %v), want 0", n, err)
		}
	}
}

// semWaiterWakes: a waiter for a full semaphore gets the permit that a
// release frees, soon after it.
func (s *suite) semWaiterWakes(t *testing.T) {
	ctx := s.ctx(t)
	c1 := s.client(t)
	needMode(t, c1, backend.Permit)
	name := s.name(t, "x")
	sem := locker.Semaphore(2)
	a := mustAcquire(t, ctx, c1, name, sem)
	b := mustAcquire(t, ctx, c1, name, sem)
	s.wakes(t, ctx, name, a, sem)
	mustRelease(t, ctx, b)
}

// wakes checks that a waiter's Acquire of name waits while l is held, gets
// it soon after l's release, and is reported as contended (a queued
// wait: the Client saw the entry made); and that its next
// Acquire, of the free lock, is not. l is released once the waiter is
// queued (queued), counted from its AcquireStart: a loaded machine may
// start the waiter's goroutine late, and a first try made after the
// release rightly finds the lock free.
func (s *suite) wakes(t *testing.T, ctx context.Context, name string, l *locker.Lock, opts ...locker.LockOption) {
	t.Helper()
	done := make(chan locker.AcquireDoneEvent, 4)
	arrived := make(arrivals, 4)
	c, _ := s.clientDriver(t, locker.WithObserver(&locker.Observer{
		AcquireStart: func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
			if e.Wait {
				select {
				case arrived <- 0:
				default:
				}
			}
			return nil
		},
		AcquireDone: func(_ context.Context, e locker.AcquireDoneEvent) { done <- e },
	}))
	reported := func(what string, want bool) {
		t.Helper()
		select {
		case e := <-done:
			if e.Err != nil || e.Contended != want {
				t.Errorf("%s: reported Contended %v (err %v), want %v", what, e.Contended, e.Err, want)
			}
		case <-time.After(time.Second):
			t.Errorf("%s: no AcquireDone event", what)
		}
	}
	base, counts := s.entries(t, ctx, name)
	got := make(chan error, 1)
	var waiter *locker.Lock
	go func() {
		var err error
		waiter, err = c.Acquire(ctx, name, opts...)
		got <- err
	}()
	s.queued(t, ctx, arrived, 0, name, base+1, counts)
	select {
	case err := <-got:
		t.Fatalf("Acquire returned before the release: %v", err)
	default:
	}
	released := time.Now()
	mustRelease(t, ctx, l)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		t.Logf("waiter acquired %v after the release", time.Since(released))
		reported("the waiter's Acquire", true)
		mustRelease(t, ctx, waiter)
	case <-time.After(s.slack() + time.Second):
		t.Fatalf("waiter not woken within %v of the release", s.slack()+time.Second)
	}
	again, err := c.Acquire(ctx, name, opts...)
	if err != nil {
		t.Fatalf("Acquire of the free lock: %v", err)
	}
	reported("an Acquire of the free lock", false)
	mustRelease(t, ctx, again)
}

// semFences: every permit's fence is above all earlier grants'.
func (s *suite) semFences(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	needMode(t, cs[0], backend.Permit)
	name := s.name(t, "x")
	sem := locker.Semaphore(2)
	var last uint64
	var held []*locker.Lock
	for i := range 6 {
		l := mustAcquire(t, ctx, cs[i%2], name, sem)
		if l.Fence() == 0 {
			mustRelease(t, ctx, l)
			t.Skip("the driver issues no fencing tokens (Grant.Fence 0)")
		}
		if l.Fence() <= last {
			t.Fatalf("permit %d got fence %d after %d: fences must strictly increase", i, l.Fence(), last)
		}
		last = l.Fence()
		held = append(held, l)
		if len(held) == 2 { // keep one held, so grants overlap
			mustRelease(t, ctx, held[0])
			held = held[1:]
		}
	}
	for _, l := range held {
		mustRelease(t, ctx, l)
	}
}

// semFIFO: permits freed one at a time go to waiters in arrival order.
func (s *suite) semFIFO(t *testing.T) {
	if !s.tr.FIFO.Has(backend.Permit) {
		t.Skip("the harness does not claim FIFO order for semaphores (Traits.FIFO)")
	}
	ctx := s.ctx(t)
	cs, arrived := s.fifoClients(t)
	needMode(t, cs[0], backend.Permit)
	name := s.name(t, "x")
	sem := locker.Semaphore(2)
	// One permit stays held throughout, so waiters pass the other one on.
	keep := mustAcquire(t, ctx, cs[0], name, sem)
	s.servedInOrder(t, ctx, cs, arrived, name, mustAcquire(t, ctx, cs[1], name, sem), sem)
	mustRelease(t, ctx, keep)
}
