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
// keep their permits, claims under any limit are refused (not
// mismatched) until the holders are within 2; raised to 3, a waiter gets
// in at once; once the resize is removed, claims' own limits rule again.
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
	if _, ok := backend.As[backend.Inspector](ops.Driver()); ok {
		if st, err := ops.Inspect(ctx, name, sem); err != nil || st.Known.Has(locker.KnowsLimit) && st.Limit != 2 {
			t.Errorf("Inspect after Resize to 2 = %+v, %v; want Limit 2", st, err)
		}
	}
	mustRefuse(t, ctx, ops, name, "3 permits are held and the limit was lowered to 2", sem)
	mustRelease(t, ctx, hs[0])
	mustRelease(t, ctx, hs[1])
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
	got := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	go func() {
		w, err := s.client(t).Acquire(wctx, name, locker.Semaphore(1))
		if err == nil {
			defer w.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("a waiter of a full semaphore got %v before the limit was raised", err)
	default:
	}
	if err := ops.Resize(ctx, name, 3); err != nil {
		t.Fatalf("Resize to 3: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter after the limit was raised: %v", err)
		}
	case <-time.After(s.slack()):
		t.Fatalf("a waiter was not granted within %v of the limit being raised", s.slack())
	}

	// Removed: once nothing is held, the claims' own limit rules.
	if err := ops.Resize(ctx, name, 0); err != nil {
		t.Fatalf("Resize to 0: %v", err)
	}
	mustRelease(t, ctx, a)
	mustRelease(t, ctx, hs[2])
	deadline := time.Now().Add(s.slack())
	for {
		st, err := ops.Inspect(ctx, name, sem)
		if err != nil || !st.Held || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the waiter's deferred release
	}
	one := locker.Semaphore(1)
	b := acquireWithin(t, ctx, ops, name, s.slack(), one)
	defer b.Release(ctx)
	mustRefuse(t, ctx, s.client(t), name, "the resize was removed and the claims say 1", one)
}
