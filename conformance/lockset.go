package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// lockSetAllOrNothing: a set with one name held is refused, waiting or
// not, and leaves none of its other names held; once free it is taken
// whole, and released whole.
func (s *suite) lockSetAllOrNothing(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, obs := s.client(t), s.client(t), s.client(t)
	a, m, z := s.name(t, "a"), s.name(t, "m"), s.name(t, "z")
	held := mustAcquire(t, ctx, c1, m)
	if _, err := c2.TryAcquireAll(ctx, []string{z, m, a}); !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), m) {
		t.Fatalf("TryAcquireAll with %s held: %v, want ErrNotAcquired naming it", m, err)
	}
	mustRelease(t, ctx, mustAcquire(t, ctx, obs, a))
	mustRelease(t, ctx, mustAcquire(t, ctx, obs, z))
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c2.AcquireAll(wctx, []string{z, m, a})
	cancel()
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("AcquireAll cut by its context: %v, want ErrNotAcquired", err)
	}
	mustRelease(t, ctx, mustAcquire(t, ctx, obs, a))
	mustRelease(t, ctx, mustAcquire(t, ctx, obs, z))

	mustRelease(t, ctx, held)
	set, err := c2.AcquireAll(ctx, []string{z, m, a})
	if err != nil {
		t.Fatalf("AcquireAll of free names: %v", err)
	}
	for _, n := range []string{a, m, z} {
		mustRefuse(t, ctx, obs, n, "the set holds it")
	}
	if err := set.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, n := range []string{a, m, z} {
		mustRelease(t, ctx, acquireWithin(t, ctx, obs, n, s.slack()))
	}
}

// lockSetCrossedOrders: callers asking for overlapping sets in crossed
// orders all finish, and no two hold a name at once.
func (s *suite) lockSetCrossedOrders(t *testing.T) {
	ctx := s.ctx(t)
	a, b, c := s.name(t, "a"), s.name(t, "b"), s.name(t, "c")
	var inside [3]atomic.Int32
	idx := map[string]int{a: 0, b: 1, c: 2}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, names := range [][]string{{a, b, c}, {c, b, a}, {b, a}, {c, a}} {
		cl := s.client(t)
		wg.Go(func() {
			for j := range 5 {
				err := cl.DoAll(ctx, names, func(context.Context, *locker.LockSet) error {
					for _, n := range names {
						if inside[idx[n]].Add(1) != 1 {
							return fmt.Errorf("two holders of %s at once", n)
						}
					}
					time.Sleep(2 * time.Millisecond)
					for _, n := range names {
						inside[idx[n]].Add(-1)
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("caller %d, round %d: %w", i, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// lockSetLost: a set is lost with any one of its locks: Lost fires, Err
// names that lock, DoAll's context ends with it as the cause, and DoAll
// releases the rest.
func (s *suite) lockSetLost(t *testing.T) {
	ctx := s.ctx(t)
	c1, obs := s.client(t), s.client(t)
	p, q := s.name(t, "p"), s.name(t, "q")
	err := c1.DoAll(ctx, []string{p, q}, func(fctx context.Context, set *locker.LockSet) error {
		if err := s.h.Expire(ctx, s.key(q)); err != nil {
			return fmt.Errorf("Harness.Expire: %w", err)
		}
		select {
		case <-fctx.Done():
		case <-time.After(s.ttl() + s.slack()):
			return errors.New("the context was not cancelled after one lock of the set was taken away")
		}
		select {
		case <-set.Lost():
		default:
			return errors.New("the context ended but Lost did not fire")
		}
		return context.Cause(fctx)
	})
	// Where locks live in a session, Expire ends the session, and with it
	// every lock of the set: either may be named.
	named := strings.Contains(err.Error(), q) || s.isSession(c1) && strings.Contains(err.Error(), p)
	if !errors.Is(err, locker.ErrLost) || !named || strings.Contains(err.Error(), "not cancelled") {
		t.Fatalf("DoAll = %v, want ErrLost naming %s", err, q)
	}
	mustRelease(t, ctx, acquireWithin(t, ctx, obs, p, s.slack()))
	mustRelease(t, ctx, acquireWithin(t, ctx, obs, q, s.ttl()+s.slack()))
}
