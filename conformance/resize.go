package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// semResize: a semaphore of 3 with 3 holders is lowered to 2: the holders
// keep their permits and are all seen, the newest can be force-released,
// claims under any limit are refused (not mismatched) until the holders
// are within 2; raised to 3, a waiter gets in at once and no more; once
// the resize is removed, claims' own limits rule again.
func (s *suite) semResize(t *testing.T) {
	ops := s.client(t)
	needMode(t, ops, backend.Permit)
	if _, ok := backend.As[backend.Resizer](ops.Driver()); !ok {
		t.Skip("the driver does not implement backend.Resizer")
	}
	ctx := s.ctx(t)
	name := s.name(t, "x")
	sem := locker.Semaphore(3)
	t.Cleanup(func() { ops.Resize(context.Background(), name, 0) })
	if _, ok := backend.As[backend.Inspector](ops.Driver()); ok {
		// A free semaphore keeps its resized limit, and shows it.
		free := s.name(t, "free")
		if err := ops.Resize(ctx, free, 4); err != nil {
			t.Fatalf("Resize of a free semaphore: %v", err)
		}
		st, err := ops.Inspect(ctx, free, sem)
		if err == nil && (st.Held || st.Known.Has(locker.KnowsLimit) && st.Limit != 4) {
			t.Errorf("Inspect of a free semaphore resized to 4 = %+v", st)
		}
		if err := ops.Resize(ctx, free, 0); err != nil {
			t.Fatalf("Resize to 0 of a free semaphore: %v", err)
		}
	}
	var hs []*locker.Lock
	for range 3 {
		hs = append(hs, mustAcquire(t, ctx, s.client(t), name, sem))
	}
	if err := ops.Resize(ctx, name, 2); err != nil {
		t.Fatalf("Resize to 2: %v", err)
	}
	for _, h := range hs {
		if err := h.Refresh(ctx); err != nil {
			t.Fatalf("a holder's Refresh after the limit was lowered below the holders: %v", err)
		}
	}
	mustRefuse(t, ctx, ops, name, "3 permits are held and the limit was lowered to 2", locker.Semaphore(5))
	s.dropNewest(t, ops, name, 2, hs) // hs[2]
	mustRefuse(t, ctx, ops, name, "2 permits are held and the limit was lowered to 2", locker.Semaphore(5))
	mustRelease(t, ctx, hs[0])
	a := mustAcquire(t, ctx, ops, name, sem)
	mustRefuse(t, ctx, ops, name, "the limit was lowered to 2, whatever the claim says", sem)
	mustRefuse(t, ctx, ops, name, "a claim under another limit is judged under the resized one", locker.Semaphore(7))
	if _, err := ops.TryAcquire(ctx, name, locker.Semaphore(7), locker.Permits(3)); errors.Is(err, backend.ErrUnsupported) {
		// Permits above 1 are refused by the core on this backend.
	} else if !errors.Is(err, locker.ErrLimitMismatch) {
		t.Errorf("a claim of 3 permits of a semaphore resized to 2 = %v, want ErrLimitMismatch", err)
	}

	// Raised: a waiter on another client gets in without waiting for a
	// release.
	type result struct {
		l   *locker.Lock
		err error
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	go func() {
		w, err := s.client(t).Acquire(wctx, name, locker.Semaphore(1))
		got <- result{w, err}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("a waiter of a full semaphore got %v before the limit was raised", r.err)
	default:
	}
	if err := ops.Resize(ctx, name, 3); err != nil {
		t.Fatalf("Resize to 3: %v", err)
	}
	var w *locker.Lock
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter after the limit was raised: %v", r.err)
		}
		w = r.l
	case <-time.After(s.slack()):
		t.Fatalf("a waiter was not granted within %v of the limit being raised", s.slack())
	}
	mustRefuse(t, ctx, ops, name, "3 permits are held under a limit raised to 3", sem)

	// Removed: once nothing is held, the claims' own limit rules.
	if err := ops.Resize(ctx, name, 0); err != nil {
		t.Fatalf("Resize to 0: %v", err)
	}
	for _, l := range []*locker.Lock{a, hs[1], w} {
		mustRelease(t, ctx, l)
	}
	one := locker.Semaphore(1)
	b := acquireWithin(t, ctx, ops, name, s.slack(), one)
	defer b.Release(ctx)
	mustRefuse(t, ctx, s.client(t), name, "the resize was removed and the claims say 1", one)
}

// dropNewest checks, where the driver can see them, that every one of hs
// still holds after the limit was lowered to limit below them (Inspect
// lists each: a grant is a grant whatever the limit now, and the limit is
// the new one), then frees the newest: force-released by its fence where
// the driver can, else released.
func (s *suite) dropNewest(t *testing.T, ops *locker.Client, name string, limit int, hs []*locker.Lock) {
	t.Helper()
	ctx := s.ctx(t)
	sem := locker.Semaphore(0)
	newest := hs[len(hs)-1]
	st, err := ops.Inspect(ctx, name, sem)
	_, breaks := backend.As[backend.Breaker](ops.Driver())
	switch {
	case errors.Is(err, locker.ErrUnsupported):
		mustRelease(t, ctx, newest)
		return
	case err != nil:
		t.Fatalf("Inspect after Resize to %d: %v", limit, err)
	case st.Known.Has(locker.KnowsLimit) && st.Limit != limit:
		t.Errorf("Inspect after Resize to %d: Limit = %d", limit, st.Limit)
	}
	if st.Known.Has(locker.KnowsHolders) && len(st.Holders) != len(hs) {
		t.Fatalf("Inspect after Resize to %d below %d holders = %+v: every holder still holds", limit, len(hs), st)
	}
	if !breaks {
		mustRelease(t, ctx, newest)
		return
	}
	if _, err := ops.ForceRelease(ctx, name, newest.Fence(), sem); err != nil {
		t.Fatalf("ForceRelease of the newest holder after Resize to %d: %v", limit, err)
	}
	waitLost(t, newest, s.ttl()+s.slack(), "ForceRelease")
}
