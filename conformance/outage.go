package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// cutClient returns a Client on a driver the harness can cut off from the
// store, and its switch; it skips when the harness cannot.
func (s *suite) cutClient(t *testing.T) (*locker.Client, func(bool)) {
	t.Helper()
	o, ok := s.h.(Outager)
	if !ok {
		t.Skip("the harness does not implement Outager: the store cannot be cut off (no network between driver and store)")
	}
	drv, down, err := o.NewCutDriver(s.ctx(t))
	if err != nil {
		t.Fatalf("NewCutDriver: %v", err)
	}
	c, err := locker.New(wrapped{drv}, locker.WithNamespace(s.ns), locker.WithDefaultTTL(s.ttl()))
	if err != nil {
		drv.Close()
		t.Fatalf("locker.New: %v", err)
	}
	// Heal before Close, so that Close does not wait out a dead network.
	t.Cleanup(func() { down(false); c.Close() })
	return c, down
}

// cutWaiter starts a blocking Acquire, on a client the harness can cut off,
// of a name another client holds, and returns once the waiter is waiting.
func (s *suite) cutWaiter(t *testing.T, ctx context.Context) (*locker.Client, func(bool), *locker.Lock, <-chan waitResult) {
	t.Helper()
	cut, down := s.cutClient(t)
	l := mustAcquire(t, ctx, s.client(t), s.name(t, "x"))
	done := acquireInBackground(ctx, cut, l.Name())
	time.Sleep(300 * time.Millisecond) // the waiter is in its wait
	return cut, down, l, done
}

// waitResult is what a blocking Acquire in the background returned, and
// when.
type waitResult struct {
	l   *locker.Lock
	err error
	at  time.Time
}

func acquireInBackground(ctx context.Context, c *locker.Client, name string) <-chan waitResult {
	done := make(chan waitResult, 1)
	go func() {
		l, err := c.Acquire(ctx, name)
		done <- waitResult{l, err, time.Now()}
	}()
	return done
}

// ridesOutOutage: a waiter whose store is unreachable for a second, less
// than backend.StoreFailureBudget, keeps waiting and takes the lock once it
// is released, whether it waits in a native queue or polls.
func (s *suite) ridesOutOutage(t *testing.T) {
	ctx := s.ctx(t)
	cut, down, l, done := s.cutWaiter(t, ctx)
	down(true)
	time.Sleep(time.Second)
	select {
	case r := <-done:
		t.Fatalf("the waiter's Acquire returned %v during a 1s outage, well within the failure budget of %v", r.err, backend.StoreFailureBudget)
	default:
	}
	mustRelease(t, ctx, l) // released during the outage: the waiter may miss its notification
	time.Sleep(200 * time.Millisecond)
	down(false)
	// A waiter that lost its session or queue place in the outage takes
	// the lock once its old entry is gone: within a session's timeout.
	within := backend.StoreFailureBudget + s.ttl() + s.sessionTTL(cut) + s.slack()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("after a 1s outage, the waiter's Acquire = %v, want the lock", r.err)
		}
		if r.l.Fence() != 0 && r.l.Fence() <= l.Fence() {
			t.Fatalf("the waiter's fence %d is not above the first holder's %d", r.l.Fence(), l.Fence())
		}
		mustRelease(t, ctx, r.l)
	case <-time.After(within):
		t.Fatalf("the waiter had not taken the free lock %v after the outage ended", within)
	}
}

// givesUpAfterBudget: a waiter whose store stays unreachable returns the
// store's error once every try has failed for backend.StoreFailureBudget,
// not earlier and not only when its context ends; what it leaves behind
// in the store does not block the name for longer than a session.
func (s *suite) givesUpAfterBudget(t *testing.T) {
	ctx := s.ctx(t)
	cut, down, l, done := s.cutWaiter(t, ctx)
	name := l.Name()
	down(true)
	cutAt := time.Now()
	budget := backend.StoreFailureBudget
	// Late by up to one more try: one request's timeout at most. A
	// driver that waits out its context (2 minutes) instead fails.
	late := budget + 5*time.Second
	var r waitResult
	select {
	case r = <-done:
	case <-time.After(late):
		down(false)
		t.Fatalf("the waiter's Acquire had not returned %v into an outage: the failure budget is %v", late, budget)
	}
	took := r.at.Sub(cutAt)
	down(false)
	if r.err == nil {
		r.l.Release(ctx)
		t.Fatalf("Acquire took a held lock through a dead connection")
	}
	if errors.Is(r.err, locker.ErrNotAcquired) || errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled) {
		t.Fatalf("Acquire = %v after %v of outage, want the store's error", r.err, took)
	}
	// The run of failures starts at the first failed try, which is no
	// earlier than the cut; 250ms of slack for a try sent just before it.
	if took < budget-250*time.Millisecond {
		t.Fatalf("Acquire gave up %v into the outage, before the failure budget of %v", took, budget)
	}
	mustRelease(t, ctx, l)
	other := s.client(t)
	acquireWithin(t, ctx, other, name, s.ttl()+s.sessionTTL(cut)+s.slack()).Release(ctx)
}

// sessionTTL is how long c's locks outlive its last contact with the
// store, for a session backend; zero otherwise.
func (s *suite) sessionTTL(c *locker.Client) time.Duration {
	if sess, ok := backend.As[backend.Session](c.Driver()); ok {
		return sess.SessionTTL()
	}
	return 0
}
