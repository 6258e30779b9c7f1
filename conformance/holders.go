package conformance

import (
	"cmp"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// The holders' cases: an operator sees each permit, reader and writer of
// a name (its owner, fence, expiry and weight), finds the name by List
// among objects of its kind alone, and frees one holder by its fence
// while the others keep theirs.

// semHolders: two holders of a semaphore of 3, the second with 2 permits
// where the driver weighs claims (else a third holder); Inspect and List
// show each, ForceRelease frees one and no other.
func (s *suite) semHolders(t *testing.T) {
	s.inspector(t)
	ops := s.client(t)
	needMode(t, ops, backend.Permit)
	ctx := s.ctx(t)
	prefix := s.name(t, "")
	name := prefix + "sem"
	sem := locker.Semaphore(3)
	holders := []*locker.Lock{mustAcquire(t, ctx, s.client(t), name, sem, locker.Label("permit-a"))}
	weights := []int{1}
	if w, ok := backend.As[backend.Weigher](ops.Driver()); ok && w.Weighs() {
		holders = append(holders, mustAcquire(t, ctx, s.client(t), name, sem, locker.Permits(2), locker.Label("permit-b")))
		weights = append(weights, 2)
	} else {
		for _, l := range []string{"permit-b", "permit-c"} {
			holders = append(holders, mustAcquire(t, ctx, s.client(t), name, sem, locker.Label(l)))
			weights = append(weights, 1)
		}
	}
	// The lock of the same name is another object.
	lock := mustAcquire(t, ctx, s.client(t), name, locker.Label("the-lock"))
	defer lock.Release(ctx)
	s.holdersSeen(t, ops, name, prefix, holders, weights, sem)
	mustRefuse(t, ctx, ops, name, "the semaphore is full", sem)
	s.breakOne(t, ops, name, holders, sem)
	l := acquireWithin(t, ctx, ops, name, s.slack(), sem)
	defer l.Release(ctx)
	if l.Fence() <= holders[0].Fence() {
		t.Errorf("fence after ForceRelease = %d, not above the removed holder's %d", l.Fence(), holders[0].Fence())
	}
	for _, h := range holders[1:] {
		mustRelease(t, ctx, h)
	}
}

// rwHolders: two readers, then a writer, of a read-write lock: Inspect
// and List show each with its side, ForceRelease frees one reader and not
// the other, then the writer.
func (s *suite) rwHolders(t *testing.T) {
	s.inspector(t)
	ops := s.client(t)
	needMode(t, ops, backend.Read)
	ctx := s.ctx(t)
	prefix := s.name(t, "")
	name := prefix + "rw"
	readers := []*locker.Lock{
		mustAcquire(t, ctx, s.client(t), name, locker.Read(), locker.Label("reader-a")),
		mustAcquire(t, ctx, s.client(t), name, locker.Read(), locker.Label("reader-b")),
	}
	s.holdersSeen(t, ops, name, prefix, readers, []int{1, 1}, locker.Read())
	s.breakOne(t, ops, name, readers, locker.Write())
	mustRelease(t, ctx, readers[1])

	w := acquireWithin(t, ctx, s.client(t), name, s.slack(), locker.Write(), locker.Label("writer"))
	st := s.holdersSeen(t, ops, name, prefix, []*locker.Lock{w}, []int{1}, locker.Read())
	if len(st.Holders) == 1 && !st.Holders[0].Write {
		t.Errorf("Inspect: the writer's holder has Write false")
	}
	s.breakOne(t, ops, name, []*locker.Lock{w}, locker.Read())
	r := acquireWithin(t, ctx, ops, name, s.slack(), locker.Read())
	defer r.Release(ctx)
	if r.Fence() <= w.Fence() {
		t.Errorf("fence after ForceRelease = %d, not above the removed writer's %d", r.Fence(), w.Fence())
	}
}

// holdersSeen checks Inspect(name, obj) and List(prefix, obj) against
// the holders ls with weights ws, and returns what Inspect saw.
func (s *suite) holdersSeen(t *testing.T, ops *locker.Client, name, prefix string, ls []*locker.Lock, ws []int, obj locker.LockOption) locker.State {
	t.Helper()
	ctx := s.ctx(t)
	st, err := ops.Inspect(ctx, name, obj)
	if errors.Is(err, locker.ErrUnsupported) {
		// A store that records no holders' fences says so up front, and
		// then refuses ForceRelease too.
		if _, err := ops.ForceRelease(ctx, name, ls[0].Fence(), obj); !errors.Is(err, locker.ErrUnsupported) {
			t.Fatalf("Inspect of the object is unsupported, but ForceRelease = %v", err)
		}
		for _, l := range ls {
			notLost(t, l)
		}
		t.Skip("the driver cannot see a semaphore's or read-write lock's holders")
	}
	if err != nil {
		t.Fatalf("Inspect(%q) of a semaphore or read-write lock: %v", name, err)
	}
	s.checkHolders(t, ops, "Inspect", st, ls, ws)
	if _, ok := backend.As[backend.Lister](ops.Driver()); !ok {
		return st
	}
	all, err := ops.List(ctx, prefix, obj)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	if len(all) != 1 || all[0].Name != name {
		t.Fatalf("List(%q) of the object = %+v, want just %q", prefix, all, name)
	}
	s.checkHolders(t, ops, "List", all[0], ls, ws)
	if locks, err := ops.List(ctx, prefix); err != nil || slices.ContainsFunc(locks, func(st locker.State) bool { return len(st.Holders) > 0 }) {
		t.Errorf("List(%q) of locks = %+v, %v: it shows a semaphore's or read-write lock's holders", prefix, locks, err)
	}
	return st
}

// checkHolders checks that st lists exactly the holders ls, by fence.
func (s *suite) checkHolders(t *testing.T, c *locker.Client, what string, st locker.State, ls []*locker.Lock, ws []int) {
	t.Helper()
	if !st.Held || !st.Known.Has(locker.KnowsHolders) || len(st.Holders) != len(ls) {
		t.Fatalf("%s = %+v, want %d holders known", what, st, len(ls))
	}
	most := s.ttl()
	if ss, ok := backend.As[backend.Session](c.Driver()); ok {
		most = max(most, ss.SessionTTL())
	}
	most += s.tr.Granularity + time.Second
	for i, h := range st.Holders {
		l := ls[i]
		if h.Fence != l.Fence() || h.Weight != ws[i] {
			t.Errorf("%s: holder %d = %+v, want fence %d and weight %d", what, i, h, l.Fence(), ws[i])
		}
		if st.Known.Has(locker.KnowsOwner) && h.Owner != l.Label() {
			t.Errorf("%s: holder %d's Owner = %q, want %q", what, i, h.Owner, l.Label())
		}
		if st.Known.Has(locker.KnowsTTL) && (h.TTL <= 0 || h.TTL > most) {
			t.Errorf("%s: holder %d's TTL = %v, want more than 0 and at most %v", what, i, h.TTL, most)
		}
	}
}

// breakOne force-releases ls[0] by its fence (after a refused attempt
// under a fence no holder has), and checks that ls[0] alone learns of it.
func (s *suite) breakOne(t *testing.T, ops *locker.Client, name string, ls []*locker.Lock, obj locker.LockOption) {
	t.Helper()
	ctx := s.ctx(t)
	top := slices.MaxFunc(ls, func(a, b *locker.Lock) int { return cmp.Compare(a.Fence(), b.Fence()) }).Fence()
	if _, err := ops.ForceRelease(ctx, name, top+1, obj); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("ForceRelease under a fence no holder has = %v, want ErrNotHeld", err)
	}
	st, err := ops.ForceRelease(ctx, name, ls[0].Fence(), obj)
	if err != nil {
		t.Fatalf("ForceRelease of one holder: %v", err)
	}
	if len(st.Holders) != 1 || st.Holders[0].Fence != ls[0].Fence() {
		t.Errorf("ForceRelease returned %+v, want just the removed holder", st)
	}
	waitLost(t, ls[0], s.ttl()+s.slack(), "ForceRelease")
	// The others keep theirs: each refresh still succeeds.
	for _, l := range ls[1:] {
		if err := l.Refresh(ctx); err != nil {
			t.Errorf("another holder's Refresh after ForceRelease: %v", err)
		}
		notLost(t, l)
	}
	if _, err := ops.ForceRelease(ctx, name, ls[0].Fence(), obj); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("second ForceRelease of the removed holder = %v, want ErrNotHeld", err)
	}
}
