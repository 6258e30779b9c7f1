package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
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

// lockSetOneGone: a set one of whose locks the store took away (as when
// its TTL runs out there) reports it: Refresh's error and Err name it,
// and Lost fires; Release says so, and frees the other names all the
// same, at once.
func (s *suite) lockSetOneGone(t *testing.T) {
	ctx := s.ctx(t)
	c, obs := s.client(t), s.client(t)
	p, q, r := s.name(t, "p"), s.name(t, "q"), s.name(t, "r")
	set, err := c.AcquireAll(ctx, []string{r, q, p})
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	// p comes first in the set's order: the others come after the one gone.
	if err := s.h.Expire(ctx, s.key(p)); err != nil {
		t.Fatalf("Harness.Expire: %v", err)
	}
	if err := set.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) || !strings.Contains(err.Error(), p) {
		t.Fatalf("the set's Refresh with %s gone = %v, want ErrNotHeld naming it", p, err)
	}
	select {
	case <-set.Lost():
	default:
		t.Fatal("a lock of the set is gone, and Lost has not fired")
	}
	if err := set.Err(); !errors.Is(err, locker.ErrLost) || !strings.Contains(err.Error(), p) {
		t.Fatalf("the set's Err = %v, want ErrLost naming %s", err, p)
	}
	if err := set.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("the set's Release with %s gone = %v, want ErrNotHeld", p, err)
	}
	for _, n := range []string{q, r} {
		mustRelease(t, ctx, mustAcquire(t, ctx, obs, n))
	}
	mustRelease(t, ctx, acquireWithin(t, ctx, obs, p, s.slack()))
}

// lockSetMany: a set of more names than some stores take in one request
// (etcd's transaction: 128 operations by default) is still taken whole by
// TryAcquireAll, each name with a fence above its previous holder's, and
// released whole by one Release: every name free at once.
func (s *suite) lockSetMany(t *testing.T) {
	ctx := s.ctx(t)
	c, obs := s.client(t), s.client(t)
	names := make([]string, 150)
	top := map[string]uint64{}
	for i := range names {
		names[i] = s.name(t, fmt.Sprintf("%03d", i))
		l := mustAcquire(t, ctx, obs, names[i])
		top[names[i]] = l.Fence()
		mustRelease(t, ctx, l)
	}
	set, err := c.TryAcquireAll(ctx, names)
	if err != nil {
		t.Fatalf("TryAcquireAll of %d free names: %v", len(names), err)
	}
	for _, n := range names {
		if f := set.Fence(n); top[n] != 0 && f <= top[n] {
			t.Fatalf("%q's fence in the set %d, not above its previous holder's %d", n, f, top[n])
		}
		top[n] = set.Fence(n)
		mustRefuse(t, ctx, obs, n, "the set holds it")
	}
	if err := set.Release(ctx); err != nil {
		t.Fatalf("the set's Release: %v", err)
	}
	for _, n := range names {
		l := mustAcquire(t, ctx, obs, n)
		fenceAbove(t, l, top[n])
		mustRelease(t, ctx, l)
	}
}

// lockSetMidway: the store is cut off from a set's acquisition at its most
// exposed moment: right after the store granted the set's first name and
// before the next request (NameByName: the driver's one-request path is
// declined), or while the set's one request is on the wire (OneRequest,
// for a backend.SetAcquirer). TryAcquireAll returns the store's error,
// within a bound, and no set; once the network is back, the names no
// request reached, and those whose give-back the store confirmed, are
// free at once and stay free (no request lands late); the others within
// a TTL (and a session's timeout) of the call's return; later fences are
// higher than any drawn before; no goroutine is left. A blocking
// AcquireAll (Blocking) keeps trying for the failure budget: it returns
// the whole set if the network comes back in time, and otherwise what
// TryAcquireAll would.
func (s *suite) lockSetMidway(t *testing.T) {
	// The subcases run side by side, each on names and a cut driver of its
	// own, most of their time spent waiting out budgets and TTLs; the
	// goroutine check covers them all once they are done (the harness's
	// proxies outlive their drivers: they are not the Client's).
	t.Cleanup(leakCheck(t, append(slices.Clip(s.tr.IgnoreGoroutines), "internal/faultproxy.")))
	for _, sc := range []struct {
		name      string
		set, wait bool
		heal      healAt
	}{
		{"NameByName/HealedBeforeGiveBack", false, false, healBeforeGiveBack},
		{"NameByName/HealedAtReturn", false, false, healAtReturn},
		{"NameByName/HealedAfterTTL", false, false, healAfterTTL},
		{"OneRequest/HealedAtReturn", true, false, healAtReturn},
		{"Blocking/HealedBeforeGiveBack", false, true, healBeforeGiveBack},
		{"Blocking/HealedAtReturn", false, true, healAtReturn},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s.midway(t, sc.set, sc.wait, sc.heal)
		})
	}
}

// healAt is when a midway cut ends.
type healAt int

const (
	healBeforeGiveBack healAt = iota // as soon as the request after the cut failed
	healAtReturn                     // as soon as the set call returned
	healAfterTTL                     // once whatever it left has expired
)

func (s *suite) midway(t *testing.T, set, wait bool, heal healAt) {
	ctx := s.ctx(t)
	o, ok := s.h.(Outager)
	if !ok {
		t.Skip("the harness does not implement Outager: the store cannot be cut off (no network between driver and store)")
	}
	obs := s.client(t)
	a, b, z := s.name(t, "a"), s.name(t, "b"), s.name(t, "z")
	var mu sync.Mutex
	top := map[string]uint64{}     // the highest fence drawn so far, by name
	confirmed := map[string]bool{} // names whose release the store confirmed
	for _, n := range []string{a, b, z} {
		l := mustAcquire(t, ctx, obs, n)
		top[n] = l.Fence()
		mustRelease(t, ctx, l)
	}

	drv, down, err := o.NewCutDriver(ctx)
	if err != nil {
		t.Fatalf("NewCutDriver: %v", err)
	}
	if _, ok := backend.As[backend.SetAcquirer](drv); set && !ok {
		drv.Close()
		t.Skip("the driver takes a set name by name (no backend.SetAcquirer)")
	}
	m := &midway{Driver: drv, down: down, set: set, healEarly: heal == healBeforeGiveBack}
	c, err := locker.New(m, locker.WithNamespace(s.ns), locker.WithDefaultTTL(s.ttl()), locker.WithObserver(&locker.Observer{
		AcquireDone: func(_ context.Context, e locker.AcquireDoneEvent) {
			mu.Lock()
			top[e.Name] = max(top[e.Name], e.Fence)
			mu.Unlock()
		},
		Released: func(e locker.ReleaseEvent) {
			mu.Lock()
			confirmed[e.Name] = e.Err == nil
			mu.Unlock()
		},
	}))
	if err != nil {
		drv.Close()
		t.Fatalf("locker.New: %v", err)
	}
	defer func() {
		down(false)
		c.Close()
	}()

	op, acquireAll := "TryAcquireAll", c.TryAcquireAll
	if wait {
		op, acquireAll = "AcquireAll", c.AcquireAll
	}
	start := time.Now()
	ls, setErr := acquireAll(ctx, []string{z, b, a})
	returned := time.Now()
	// By then, whatever the call left in the store has expired.
	deadline := returned.Add(s.ttl() + s.sessionTTL(c) + s.slack())
	switch heal {
	case healAtReturn:
		down(false)
	case healAfterTTL:
		time.Sleep(time.Until(deadline))
		down(false)
	}
	mu.Lock()
	mustFree := map[string]bool{ // free at once
		a: heal == healAfterTTL || !set && confirmed[a],
		b: !set || heal == healAfterTTL,
		z: !set || heal == healAfterTTL,
	}
	top = maps.Clone(top)
	t.Logf("%s returned in %v: %v; give-back confirmed: %v", op, returned.Sub(start).Round(time.Millisecond), setErr, confirmed)
	mu.Unlock()
	if bound := backend.StoreFailureBudget + 5*time.Second; returned.Sub(start) > bound {
		t.Errorf("%s returned %v after the cut began, more than %v", op, returned.Sub(start), bound)
	}
	switch err := setErr; {
	case err == nil && wait && heal == healBeforeGiveBack:
		// The wait rode out the cut: the whole set, which goes whole.
		if got := len(ls.Names()); got != 3 {
			t.Fatalf("AcquireAll returned a set of %d names of 3: %v", got, ls.Names())
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatalf("the set's Release = %v", err)
		}
		mustFree = map[string]bool{a: true, b: true, z: true}
	case err == nil && !set:
		t.Fatalf("%s took %v through a cut connection", op, ls.Names())
	case err == nil:
		// The request landed, and its answer came back before the cut.
		if got := len(ls.Names()); got != 3 {
			t.Fatalf("TryAcquireAll returned a set of %d names of 3: %v", got, ls.Names())
		}
		t.Logf("the set's request landed before the cut; Release = %v", ls.Release(ctx))
		mustFree = map[string]bool{}
	case ls != nil:
		t.Fatalf("%s returned a set and an error: %v", op, err)
	case wait && errors.Is(err, locker.ErrLost):
		// A name taken before the cut was lost while the wait rode it
		// out (a session outlived by the cut): the loss is the answer.
	case errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		t.Fatalf("%s = %v, want the store's error", op, err)
	}

	// A request that lands after it was answered as failed lands once the
	// network is back: the names free at once are tried until then.
	for until := time.Now().Add(s.slack()); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
		for _, n := range []string{a, b, z} {
			if mustFree[n] {
				l, err := obs.TryAcquire(ctx, n)
				if err != nil {
					t.Fatalf("TryAcquire(%q) %v after the set call returned, the network back = %v; the set call (%v) left it held", n, time.Since(returned).Round(time.Millisecond), err, setErr)
				}
				fenceAbove(t, l, top[n])
				mustRelease(t, ctx, l)
			}
		}
	}
	for _, n := range []string{a, b, z} {
		if !mustFree[n] {
			l := acquireWithin(t, ctx, obs, n, time.Until(deadline))
			fenceAbove(t, l, top[n])
			mustRelease(t, ctx, l)
		}
	}
}

// fenceAbove fails t when l's fence is not above top.
func fenceAbove(t *testing.T, l *locker.Lock, top uint64) {
	t.Helper()
	if l.Fence() != 0 && l.Fence() <= top {
		t.Fatalf("%q's fence %d is not above %d, drawn before", l.Name(), l.Fence(), top)
	}
}

// midway is a driver the harness can cut off, which cuts itself off in the
// middle of a lock set's acquisition.
type midway struct {
	backend.Driver
	down      func(bool)
	set       bool // cut while the set's one request is on the wire; else decline it
	healEarly bool // heal once the request after the cut failed
	tries     atomic.Int32
}

func (m *midway) Unwrap() backend.Driver { return m.Driver }

// TryAcquire cuts the network right after the first grant.
func (m *midway) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	g, err := m.Driver.TryAcquire(ctx, c)
	m.tried(err == nil)
	return g, err
}

// tried cuts the network after the first try if it took its name, and
// heals it after the second if healEarly.
func (m *midway) tried(granted bool) {
	switch n := m.tries.Add(1); {
	case n == 1 && granted:
		m.down(true)
	case n == 2 && m.healEarly:
		m.down(false)
	}
}

// QueueModes and Enqueue pass a native queue through, for a blocking set:
// its first grant cuts the network as TryAcquire's does.
func (m *midway) QueueModes() backend.ModeSet {
	if q, ok := backend.As[backend.Queuer](m.Driver); ok {
		return q.QueueModes()
	}
	return 0
}

func (m *midway) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	q, _ := backend.As[backend.Queuer](m.Driver)
	g, tk, err := q.Enqueue(ctx, c)
	m.tried(err == nil && tk == nil)
	return g, tk, err
}

// TryAcquireAll cuts the network while the request may or may not have
// reached the store; without set, it declines, so that the Client takes
// the names one at a time.
func (m *midway) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	sa, ok := backend.As[backend.SetAcquirer](m.Driver)
	if !m.set || !ok {
		return nil, backend.ErrUnsupported
	}
	cut := make(chan struct{})
	go func() {
		m.down(true)
		close(cut)
	}()
	g, err := sa.TryAcquireAll(ctx, claims)
	<-cut
	return g, err
}

func (m *midway) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	if sa, ok := backend.As[backend.SetAcquirer](m.Driver); ok {
		return sa.ReleaseAll(ctx, claims)
	}
	errs := make([]error, len(claims))
	for i, c := range claims {
		errs[i] = m.Driver.Release(ctx, c)
	}
	return errs
}
