package zklock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
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
	fresh := []string{base + "/a", base + "/b", base + "/c"}
	known := []string{base + "/x", base + "/y", base + "/z"}
	keep(t, d, known...)
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
		ns, _, err := d.listing(ctx, d.parentPath(key))
		if err != nil {
			t.Fatal(err)
		}
		return len(ns)
	}
	// cycle takes keys and releases them, each in one multi-op alone.
	cycle := func(what string, keys []string) {
		t.Helper()
		cs := set(keys...)
		var gs []backend.Grant
		var err error
		if n := sent(func() { gs, err = d.TryAcquireAll(ctx, cs) }); err != nil || len(n) != 1 || n[opMulti] != 1 {
			t.Fatalf("%s: TryAcquireAll: %v, sent %v; want one multi-op alone", what, err, n)
		}
		for i, l := range cs {
			path, _, first, err := d.lookup(ctx, l)
			_, st, serr := d.conn.Exists(path)
			if err != nil || serr != nil || !first || uint64(st.Czxid) != gs[i].Fence || gs[i].Fence != gs[0].Fence {
				t.Fatalf("%s: %s: node %q first %v, fence %d, czxid %d: %v %v", what, l.Key, path, first, gs[i].Fence, st.Czxid, err, serr)
			}
			cs[i].Fence = gs[i].Fence
		}
		var errs []error
		if n := sent(func() { errs = d.ReleaseAll(ctx, cs) }); len(n) != 1 || n[opMulti] != 1 {
			t.Errorf("%s: ReleaseAll sent %v; want one multi-op alone", what, n)
		}
		for i, err := range errs {
			if err != nil || nodes(cs[i].Key) != 0 {
				t.Fatalf("%s: ReleaseAll %s: %v, %d nodes left", what, cs[i].Key, err, nodes(cs[i].Key))
			}
		}
	}
	cycle("new names", fresh)
	take(t, d, known...) // the names' nodes, someone else's: now known
	cycle("known names", known)

	held := lockFor(t, known[1])
	if _, err := other.TryAcquire(ctx, held); err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx, held)
	var err error
	n := sent(func() { _, err = d.TryAcquireAll(ctx, set(known...)) })
	if !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held name: %v, want ErrNotAcquired", err)
	}
	if n[opMulti] != 2 || n[opGetChildren]+n[opGetChildren2] != 1 || n[opDelete] != 0 {
		t.Errorf("TryAcquireAll over a held name sent %v; want two multi-ops, one listing", n)
	}
	for i, k := range known {
		if want := i % 2; nodes(k) != want {
			t.Errorf("%s has %d nodes after the refused set, want %d", k, nodes(k), want)
		}
	}
}

// keep makes the nodes of names keys, as persistent nodes that the server
// keeps empty (a container goes within a second once empty, in the test
// servers), until the test ends.
func keep(t *testing.T, d *Driver, keys ...string) {
	t.Helper()
	for _, k := range keys {
		p := d.parentPath(k)
		if _, err := d.conn.Create(p, []byte{}, 0, d.acl); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := d.conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				t.Errorf("delete %s: %v", p, err)
			}
		})
	}
}

// take takes keys with d in one set and releases them.
func take(t *testing.T, d *Driver, keys ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := make([]backend.Claim, len(keys))
	for i, k := range keys {
		cs[i] = lockFor(t, k)
	}
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil {
		t.Fatalf("TryAcquireAll %v: %v", keys, err)
	}
	for i := range cs {
		cs[i].Fence = gs[i].Fence
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", keys[i], err)
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
		if ns, _, err := d.listing(ctx, d.parentPath(cs[i].Key)); err != nil || len(ns) != 0 {
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
			// 0, then 50µs growing by a sixth each round, to 20ms.
			cctx, ccancel := context.WithTimeout(ctx, time.Duration(float64(min(i, 1))*50*math.Pow(7.0/6, float64(i)))*time.Microsecond)
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
				if ns, _, qerr := d.listing(ctx, d.parentPath(k)); qerr != nil || len(ns) != 0 {
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

// A set takes names whose nodes exist unknown to the driver (another's)
// and names whose nodes were deleted since the driver saw them: a refused
// multi-op for each, then the set.
func TestAcquireAllNamesNodes(t *testing.T) {
	t.Parallel()
	var o opCounter
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer))
	base := uniqueKey(t)
	a, b, c := base+"/a", base+"/b", base+"/c"
	keep(t, d, a, b)
	// count takes keys and releases them: multi-ops sent, ACL reads sent.
	count := func(keys ...string) (int, int) {
		before := o.snapshot()
		take(t, d, keys...)
		after := o.snapshot()
		return after[opMulti] - before[opMulti], after[opGetACL] - before[opGetACL]
	}
	// "Node exists" for a, then for b (a refusal names one), then the
	// set, a's and b's nodes taken as they are, their ACLs read; the
	// release.
	if multis, acls := count(a, b, c); multis != 4 || acls != 2 {
		t.Errorf("a set over names made by another sent %d multi-ops, %d ACL reads; want 4, 2", multis, acls)
	}
	for _, k := range []string{a, b} {
		if err := d.conn.Delete(d.parentPath(k), -1); err != nil {
			t.Fatal(err)
		}
	}
	// "No node" for a, then for b, then the set; the release.
	if multis, acls := count(a, b); multis != 4 || acls != 0 {
		t.Errorf("a set over names deleted since sent %d multi-ops, %d ACL reads; want 4, 0", multis, acls)
	}
}

// A set whose multi-op was applied but whose reply was lost returns an
// error when its context ends, and its nodes, found by their hashes, are
// deleted once the connection is back, its session alive.
func TestAcquireAllReplyLost(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	p := newProxy(t, servers[0])
	d, other := dial(t, []string{p.addr()}), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := uniqueKey(t)
	keys := []string{base + "/a", base + "/b"}
	cs := []backend.Claim{lockFor(t, keys[0]), lockFor(t, keys[1])}
	sid := d.conn.SessionID()
	p.blackhole(false, true) // the server hears, the driver does not
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	if gs, err := d.TryAcquireAll(cctx, cs); err == nil {
		t.Fatalf("TryAcquireAll without replies: %+v, want an error", gs)
	}
	for _, k := range keys {
		if n := entries(t, other, k); n != 1 {
			t.Fatalf("%s has %d nodes while the replies are lost, want the set's one", k, n)
		}
	}
	p.blackhole(false, false)
	p.cut()
	deadline := time.Now().Add(2 * testTimeout)
	for _, k := range keys {
		for entries(t, other, k) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still has a node %v after the connection came back", k, 2*testTimeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if d.conn.SessionID() != sid {
		t.Errorf("the session changed: the nodes went with it, not by the driver")
	}
}

// A set too large for one request (the server drops the connection that
// sends a request past its jute.maxbuffer, 1 MiB by default) is declined,
// for the Client to take name by name: the connection stays.
func TestSetTooLargeForOneRequest(t *testing.T) {
	t.Parallel()
	var dials atomic.Int32
	d := dial(t, testenv.ZKAddrs(), WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		dials.Add(1)
		return net.DialTimeout(network, addr, timeout)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base, long := uniqueKey(t), strings.Repeat("x", 240)
	cs := make([]backend.Claim, 2000)
	for i := range cs {
		cs[i] = lockFor(t, fmt.Sprintf("%s/%s%04d", base, long, i))
	}
	if _, err := d.TryAcquireAll(ctx, cs); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("TryAcquireAll of 2000 long names: %v, want ErrUnsupported", err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials: a request dropped the connection", n)
	}
}
