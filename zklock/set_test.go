package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A free set is one multi-op (the names' nodes too, when new), one zxid
// as every fence; its release another. A set with a held name leaves no
// node: one listing (the held name's queue) and one multi-op to delete.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	var o opCounter
	// A long session, and its first ping past: no ping (an Exists, as
	// grant's confirm) among the requests counted.
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer), WithSessionTimeout(30*time.Second))
	other := dial(t, testenv.ZKAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; o.snapshot()[opExists] == 0; i++ {
		if i == 100 {
			t.Fatal("no ping in a second")
		}
		time.Sleep(10 * time.Millisecond)
	}
	base := uniqueKey(t)
	keys := []string{base + "/a", base + "/b", base + "/c"}
	set := func(keys ...string) []backend.Claim {
		cs := make([]backend.Claim, len(keys))
		for i, k := range keys {
			cs[i] = lockFor(t, k)
		}
		return cs
	}
	// sent counts the requests of f, but pings, by opcode.
	sent := func(f func()) map[int32]int {
		before := o.snapshot()
		f()
		after := o.snapshot()
		m := map[int32]int{}
		for op, n := range after {
			if op > 0 && n != before[op] {
				m[op] = n - before[op]
			}
		}
		return m
	}
	nodes := func(key string) int {
		ns, err := d.queue(ctx, d.parentPath(key))
		if err != nil {
			t.Fatal(err)
		}
		return len(ns)
	}
	for cycle := range 2 { // new names, then known ones
		cs := set(keys...)
		var gs []backend.Grant
		var err error
		if n := sent(func() { gs, err = d.TryAcquireAll(ctx, cs) }); err != nil || len(n) != 1 || n[opMulti] != 1 {
			t.Fatalf("cycle %d: TryAcquireAll of free names: %v, sent %v; want one multi-op alone", cycle, err, n)
		}
		for i, l := range cs {
			path, _, first, err := d.lookup(ctx, l)
			_, st, serr := d.conn.Exists(path)
			if err != nil || serr != nil || !first || uint64(st.Czxid) != gs[i].Fence || gs[i].Fence != gs[0].Fence {
				t.Fatalf("cycle %d: %s: node %q first %v, fence %d, czxid %d: %v %v", cycle, l.Key, path, first, gs[i].Fence, st.Czxid, err, serr)
			}
			cs[i].Fence = gs[i].Fence
		}
		var errs []error
		if n := sent(func() { errs = d.ReleaseAll(ctx, cs) }); len(n) != 1 || n[opMulti] != 1 {
			t.Errorf("cycle %d: ReleaseAll sent %v; want one multi-op alone", cycle, n)
		}
		for i, err := range errs {
			if err != nil || nodes(cs[i].Key) != 0 {
				t.Fatalf("cycle %d: ReleaseAll %s: %v, %d nodes left", cycle, cs[i].Key, err, nodes(cs[i].Key))
			}
		}
	}

	if _, err := other.TryAcquire(ctx, lockFor(t, keys[1])); err != nil {
		t.Fatal(err)
	}
	var err error
	n := sent(func() { _, err = d.TryAcquireAll(ctx, set(keys...)) })
	if !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held name: %v, want ErrNotAcquired", err)
	}
	if n[opMulti] != 2 || n[opGetChildren]+n[opGetChildren2] != 1 || n[opDelete] != 0 {
		t.Errorf("TryAcquireAll over a held name sent %v; want two multi-ops, one listing", n)
	}
	for i, k := range keys {
		if want := min(i%2, 1); nodes(k) != want {
			t.Errorf("%s has %d nodes after the refused set, want %d", k, nodes(k), want)
		}
	}
}

// A release whose multi-op is refused (a node deleted behind the
// driver's back) reports that claim not held and releases the others.
func TestReleaseAllOneGone(t *testing.T) {
	t.Parallel()
	d := dial(t, testenv.ZKAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := uniqueKey(t)
	cs := []backend.Claim{lockFor(t, base+"/a"), lockFor(t, base+"/b"), lockFor(t, base+"/c")}
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cs {
		cs[i].Fence = gs[i].Fence
	}
	path, _, _, err := d.lookup(ctx, cs[1])
	if err != nil || path == "" {
		t.Fatalf("node of %s: %q %v", cs[1].Key, path, err)
	}
	if err := d.conn.Delete(path, -1); err != nil {
		t.Fatal(err)
	}
	errs := d.ReleaseAll(ctx, cs)
	for i, err := range errs {
		if gone := i == 1; gone != errors.Is(err, backend.ErrNotHeld) || !gone && err != nil {
			t.Errorf("ReleaseAll %s: %v (node deleted: %v)", cs[i].Key, err, gone)
		}
		if ns, err := d.queue(ctx, d.parentPath(cs[i].Key)); err != nil || len(ns) != 0 {
			t.Errorf("%s: %d nodes left: %v", cs[i].Key, len(ns), err)
		}
	}
}

// A TryAcquireAll cancelled at any point leaves no node by the time it
// returns, on the caller's goroutine (its reads cut) or on one of the
// driver's (the nodes taken back).
func TestAcquireAllCancelled(t *testing.T) {
	t.Parallel()
	for _, aside := range []bool{false, true} {
		d := dial(t, testenv.ZKAddrs())
		d.testNoInline = aside
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		base := uniqueKey(t)
		keys := []string{base + "/a", base + "/b", base + "/c", base + "/d"}
		won, cut := 0, 0
		for i := range 40 {
			cs := make([]backend.Claim, len(keys))
			for j, k := range keys {
				cs[j] = lockFor(t, k)
			}
			cctx, ccancel := context.WithTimeout(ctx, time.Duration(i)*50*time.Microsecond)
			gs, err := d.TryAcquireAll(cctx, cs)
			ccancel()
			if err == nil {
				won++
				for j := range cs {
					cs[j].Fence = gs[j].Fence
				}
				for j, err := range d.ReleaseAll(ctx, cs) {
					if err != nil {
						t.Fatalf("aside %v, round %d: ReleaseAll %s: %v", aside, i, keys[j], err)
					}
				}
				continue
			}
			cut++
			for _, k := range keys {
				if ns, qerr := d.queue(ctx, d.parentPath(k)); qerr != nil || len(ns) != 0 {
					t.Fatalf("aside %v, round %d: TryAcquireAll returned %v, and left %d nodes under %s (%v)", aside, i, err, len(ns), k, qerr)
				}
			}
		}
		t.Logf("aside %v: %d taken, %d cancelled", aside, won, cut)
		if won == 0 || cut == 0 {
			t.Errorf("aside %v: %d taken, %d cancelled: the sweep missed one side", aside, won, cut)
		}
	}
}
