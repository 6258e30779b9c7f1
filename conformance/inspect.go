package conformance

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// The operator's cases run on drivers that implement the optional
// interface they need (backend.Inspector, Lister, Breaker) and skip
// elsewhere. Each field a driver claims to know (State.Known) is checked;
// the fields it leaves out are not.

func (s *suite) inspector(t *testing.T) {
	t.Helper()
	if _, ok := backend.As[backend.Inspector](s.client(t).Driver()); !ok {
		t.Skip("the driver does not implement backend.Inspector")
	}
}

// inspectHolder checks that st describes l, as seen by another client.
func (s *suite) inspectHolder(t *testing.T, c *locker.Client, st locker.State, l *locker.Lock) {
	t.Helper()
	if !st.Held {
		t.Fatalf("Inspect(%q) = %+v while it is held", l.Name(), st)
	}
	if st.Name != l.Name() {
		t.Errorf("Inspect: Name = %q, want %q", st.Name, l.Name())
	}
	if st.Known.Has(locker.KnowsOwner) && st.Owner != l.Label() {
		t.Errorf("Inspect: Owner = %q, want %q", st.Owner, l.Label())
	}
	if st.Known.Has(locker.KnowsFence) && st.Fence != l.Fence() {
		t.Errorf("Inspect: Fence = %d, want the holder's %d", st.Fence, l.Fence())
	}
	if st.Known.Has(locker.KnowsTTL) {
		most := l.TTL()
		if ss, ok := backend.As[backend.Session](c.Driver()); ok {
			most = max(most, ss.SessionTTL())
		}
		most += s.tr.Granularity + time.Second
		if st.TTL <= 0 || st.TTL > most {
			t.Errorf("Inspect: TTL = %v, want more than 0 and at most %v", st.TTL, most)
		}
	}
}

// inspectReports: Inspect from another client sees the holder's owner,
// fence and time left, the queue behind it where the store keeps one,
// the next holder after a release, and a free lock at the end.
func (s *suite) inspectReports(t *testing.T) {
	s.inspector(t)
	ctx := s.ctx(t)
	c1, c2, ops := s.client(t), s.client(t), s.client(t)
	name := s.name(t, "x")

	st, err := ops.Inspect(ctx, name)
	if err != nil || st.Held {
		t.Fatalf("Inspect of a name never locked = %+v, %v; want free", st, err)
	}
	l := mustAcquire(t, ctx, c1, name, locker.Label("ops-first"))
	if st, err = ops.Inspect(ctx, name); err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	s.inspectHolder(t, ops, st, l)

	got := make(chan *locker.Lock, 1)
	go func() {
		w, err := c2.Acquire(ctx, name, locker.Label("ops-second"))
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- w
	}()
	if st.Known.Has(locker.KnowsWaiters) {
		deadline := time.Now().Add(5 * time.Second)
		for st.Waiters == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			if st, err = ops.Inspect(ctx, name); err != nil {
				t.Fatalf("Inspect: %v", err)
			}
		}
		if st.Waiters != 1 {
			t.Errorf("Inspect with one waiter: Waiters = %d, want 1", st.Waiters)
		}
		if st.Known.Has(locker.KnowsQueue) && !slices.Equal(st.Queue, []string{"ops-second"}) {
			t.Errorf("Inspect with one waiter: Queue = %q, want [ops-second]", st.Queue)
		}
	} else {
		time.Sleep(100 * time.Millisecond) // the waiter has tried once
	}
	mustRelease(t, ctx, l)
	var w *locker.Lock
	select {
	case w = <-got:
	case <-time.After(s.slack() + time.Second):
		t.Fatalf("waiter not woken within %v of the release", s.slack()+time.Second)
	}
	if w == nil {
		return
	}
	if st, err = ops.Inspect(ctx, name); err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	s.inspectHolder(t, ops, st, w)
	if st.Known.Has(locker.KnowsWaiters) && st.Waiters != 0 {
		t.Errorf("Inspect with no waiter left: Waiters = %d", st.Waiters)
	}
	mustRelease(t, ctx, w)
	if st, err = ops.Inspect(ctx, name); err != nil || st.Held {
		t.Fatalf("Inspect after the release = %+v, %v; want free", st, err)
	}
}

// listFinds: List returns exactly the held locks under a prefix, sorted,
// each as Inspect would describe it, and drops a lock once released.
func (s *suite) listFinds(t *testing.T) {
	c, ops := s.client(t), s.client(t)
	if _, ok := backend.As[backend.Lister](c.Driver()); !ok {
		t.Skip("the driver does not implement backend.Lister")
	}
	ctx := s.ctx(t)
	prefix := s.name(t, "")
	names := []string{prefix + "a/1", prefix + "b ü", prefix + "c%2F"}
	var locks []*locker.Lock
	for _, n := range names {
		locks = append(locks, mustAcquire(t, ctx, c, n, locker.Label("lister")))
	}
	outside := mustAcquire(t, ctx, c, s.name(t, "")[:len(prefix)-1]+"-outside")
	defer outside.Release(ctx)

	check := func(want []*locker.Lock) {
		t.Helper()
		got, err := ops.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		var gotNames, wantNames []string
		for _, st := range got {
			gotNames = append(gotNames, st.Name)
		}
		for _, l := range want {
			wantNames = append(wantNames, l.Name())
		}
		if !slices.Equal(gotNames, wantNames) {
			t.Fatalf("List(%q) names = %q, want %q", prefix, gotNames, wantNames)
		}
		for i, st := range got {
			s.inspectHolder(t, ops, st, want[i])
		}
	}
	check(locks)
	mustRelease(t, ctx, locks[1])
	check([]*locker.Lock{locks[0], locks[2]})
	for _, l := range []*locker.Lock{locks[0], locks[2]} {
		mustRelease(t, ctx, l)
	}
	check(nil)
}

// forceRelease: ForceRelease under a fence that is not the holder's
// changes nothing; under the holder's, it frees the lock at once, the
// next holder's fence is above the removed one's, and the removed holder
// learns of its loss.
func (s *suite) forceRelease(t *testing.T) {
	c, ops, next := s.client(t), s.client(t), s.client(t)
	if _, ok := backend.As[backend.Breaker](c.Driver()); !ok {
		t.Skip("the driver does not implement backend.Breaker")
	}
	ctx := s.ctx(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c, name, locker.Label("stuck"))
	if l.Fence() == 0 {
		t.Fatal("the driver implements Breaker but issues no fences")
	}

	if _, err := ops.ForceRelease(ctx, name, l.Fence()+1); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("ForceRelease under another fence = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, next, name, "a ForceRelease under another fence freed it")
	notLost(t, l)

	st, err := ops.ForceRelease(ctx, name, l.Fence())
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	s.inspectHolder(t, ops, st, l)
	// The holder learns by its next refresh, before anyone needs to take
	// the lock: its refresh must not take a freed lock back.
	waitLost(t, l, s.ttl()+s.slack(), "ForceRelease")
	n := acquireWithin(t, ctx, next, name, s.slack())
	defer n.Release(ctx)
	if n.Fence() <= l.Fence() {
		t.Errorf("fence after ForceRelease = %d, not above the removed holder's %d", n.Fence(), l.Fence())
	}
	if _, err := ops.ForceRelease(ctx, name, l.Fence()); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("second ForceRelease of the removed holder = %v, want ErrNotHeld", err)
	}
}
