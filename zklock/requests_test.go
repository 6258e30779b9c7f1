package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// The opcodes of ZooKeeper's requests that the tests count.
const (
	opCreate          = 1
	opDelete          = 2
	opExists          = 3
	opGetData         = 4
	opSetData         = 5
	opGetACL          = 6
	opGetChildren     = 8
	opGetChildren2    = 12
	opMulti           = 14
	opCreateContainer = 19
)

// opCounter counts the requests a connection sends, by opcode.
type opCounter struct {
	mu  sync.Mutex
	ops map[int32]int
}

func (o *opCounter) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, o: o}, nil
}

func (o *opCounter) snapshot() map[int32]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[int32]int, len(o.ops))
	for k, v := range o.ops {
		m[k] = v
	}
	return m
}

type countingConn struct {
	net.Conn
	o *opCounter
}

// Write sees one request per call (the zk client writes each whole):
// length, xid, opcode.
func (c *countingConn) Write(p []byte) (int, error) {
	if len(p) >= 12 {
		c.o.mu.Lock()
		if c.o.ops == nil {
			c.o.ops = map[int32]int{}
		}
		c.o.ops[int32(binary.BigEndian.Uint32(p[8:12]))]++
		c.o.mu.Unlock()
	}
	return c.Conn.Write(p)
}

// An uncontended acquire+release on a new name costs one multi-op (the
// name's node and the queue node together) and one delete: no separate
// create of the name's node, no listing, no failed first try.
func TestFreshNameRequests(t *testing.T) {
	t.Parallel()
	var o opCounter
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		l := lockFor(t, uniqueKey(t))
		before := o.snapshot()
		g, err := acquire(ctx, d, l)
		if err != nil {
			t.Fatal(err)
		}
		mid := o.snapshot()
		l.Fence = g.Fence
		path, _, first, err := d.lookup(ctx, l)
		if err != nil || !first {
			t.Fatalf("cycle %d: node %q first %v: %v", i, path, first, err)
		}
		_, st, err := d.conn.Exists(path)
		if err != nil || uint64(st.Czxid) != g.Fence || st.EphemeralOwner != d.conn.SessionID() {
			t.Fatalf("cycle %d: fence %d, node %+v: %v", i, g.Fence, st, err)
		}
		beforeRelease := o.snapshot()
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		after := o.snapshot()
		sent := func(op int32) int { return mid[op] - before[op] }
		if sent(opMulti) != 1 || sent(opCreate)+sent(opCreateContainer) != 0 || sent(opGetChildren)+sent(opGetChildren2) != 0 {
			t.Errorf("cycle %d: acquire sent %d multi-ops, %d creates, %d listings; want 1, 0, 0", i,
				sent(opMulti), sent(opCreate)+sent(opCreateContainer), sent(opGetChildren)+sent(opGetChildren2))
		}
		if n := after[opDelete] - beforeRelease[opDelete]; n != 1 {
			t.Errorf("cycle %d: release sent %d deletes, want 1", i, n)
		}
	}
}

// An acquire+release on a name whose node exists costs the same: one
// multi-op (the queue node, and the write to the name's node whose stat
// carries the fence and says the node is first) and one delete.
func TestKnownNameRequests(t *testing.T) {
	t.Parallel()
	var o opCounter
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	// Hold the name's node with a lock of another driver's, so that the
	// server keeps it between our cycles.
	other := dial(t, testenv.ZKAddrs())
	keep := lockFor(t, key+"/keep")
	if _, err := other.TryAcquire(ctx, keep); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		l := lockFor(t, key)
		before := o.snapshot()
		if _, err := acquire(ctx, d, l); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		after := o.snapshot()
		total := 0
		for op, n := range after {
			if op > 0 { // not pings (-11)
				total += n - before[op]
			}
		}
		if after[opMulti]-before[opMulti] != 1 || after[opDelete]-before[opDelete] != 1 || (i > 0 && total != 2) {
			t.Errorf("cycle %d: %d requests, %d multi-ops, %d deletes; want 2, 1, 1", i, total,
				after[opMulti]-before[opMulti], after[opDelete]-before[opDelete])
		}
	}
}

// A permit's claim behind a holder costs its create multi-op and one
// listing, whose names say that no resize record stands: no read more
// than before Resize existed. Once the semaphore is resized, the same
// claim reads the record too (one request), and so does a claim alone in
// the queue, whose create's reply counts the record among the children.
func TestPermitRequests(t *testing.T) {
	t.Parallel()
	var o opCounter
	servers := testenv.ZKAddrs()
	d, other := dial(t, servers, WithDialer(o.dialer)), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	if _, err := other.TryAcquire(ctx, sharedClaim(t, key, backend.Permit, 3)); err != nil {
		t.Fatal(err)
	}
	cycle := func(what string, key string, reads int) {
		t.Helper()
		var before map[int32]int
		for range 2 { // the first learns that the name's node exists
			l := sharedClaim(t, key, backend.Permit, 3)
			before = o.snapshot()
			if _, err := d.TryAcquire(ctx, l); err != nil {
				t.Fatal(err)
			}
			if err := d.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		after := o.snapshot()
		sent := func(op int32) int { return after[op] - before[op] }
		if sent(opMulti) != 1 || sent(opGetChildren)+sent(opGetChildren2) != 1 || sent(opGetData) != reads || sent(opDelete) != 1 {
			t.Errorf("%s: %d multi-ops, %d listings, %d reads, %d deletes; want 1, 1, %d, 1", what,
				sent(opMulti), sent(opGetChildren)+sent(opGetChildren2), sent(opGetData), sent(opDelete), reads)
		}
	}
	cycle("behind a holder, never resized", key, 0)
	if err := other.Resize(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	cycle("behind a holder, resized", key, 1)
	alone := uniqueKey(t)
	if err := other.Resize(ctx, alone, 2); err != nil {
		t.Fatal(err)
	}
	cycle("alone, resized", alone, 1)
}

// The store tries (measure.StoreTries) count a waiting acquisition's
// requests that could grant it: an uncontended Acquire's create; a
// waiter's create and its listing, and none when the watch on its only
// predecessor says it is gone; TryAcquire's, none.
func TestStoreTries(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	holder, waiter := dial(t, servers), dial(t, servers)
	holderTries, _ := measure.StoreTries(holder)
	waiterTries, _ := measure.StoreTries(waiter)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	hl := lockFor(t, key)
	if _, err := holder.TryAcquire(ctx, hl); err != nil {
		t.Fatal(err)
	}
	if n := holderTries(); n != 0 {
		t.Errorf("TryAcquire counted %d tries, want 0", n)
	}
	// A refused try: no count, and the waiter knows the name's node now
	// (else its first create is the new name's multi-op, refused, then
	// the usual one: two tries).
	if _, err := waiter.TryAcquire(ctx, lockFor(t, key)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: %v", err)
	}
	if n := waiterTries(); n != 0 {
		t.Errorf("TryAcquire counted %d tries, want 0", n)
	}
	done := make(chan error, 1)
	wl := lockFor(t, key)
	go func() {
		_, err := acquire(ctx, waiter, wl)
		done <- err
	}()
	for entries(t, holder, key) != 2 {
		time.Sleep(5 * time.Millisecond)
	}
	// Queued; give it the time to list the queue and watch its
	// predecessor (bounded: the test's context). A release before the
	// watch is set makes it list again, a third try: wait until the
	// server shows the watch (wchc) rather than for a set time, which a
	// loaded machine may not send the watch in; 50ms on a server that does
	// not answer wchc, and at most 5s.
	for waiterTries() < 2 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	sid := waiter.conn.SessionID()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		armed, answers := watching(t, servers[0], sid, key)
		if !answers {
			time.Sleep(50 * time.Millisecond)
		}
		if armed || !answers {
			break
		}
	}
	if err := holder.Release(ctx, hl); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := waiterTries(); n != 2 {
		t.Errorf("a waiter behind one holder counted %d tries, want 2 (its create, its listing)", n)
	}
	if err := waiter.Release(ctx, wl); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(ctx, holder, lockFor(t, uniqueKey(t))); err != nil {
		t.Fatal(err)
	}
	if n := holderTries(); n != 1 {
		t.Errorf("an uncontended Acquire counted %d tries, want 1", n)
	}
}

// watching reports whether the server at addr has a watch of session sid
// on a node of key (its four-letter word wchc lists the watches by
// session: "0x<session>", then a tab and a path a line), and whether it
// answered wchc at all.
func watching(t *testing.T, addr string, sid int64, key string) (armed, answers bool) {
	t.Helper()
	out := fourLetter(t, addr, "wchc")
	if !strings.HasPrefix(out, "0x") && out != "" {
		return false, false
	}
	esc, me := backend.EscapeKey(key), fmt.Sprintf("0x%x", uint64(sid))
	mine := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "0x") {
			mine = strings.TrimSpace(line) == me
		} else if mine && strings.Contains(line, esc) {
			return true, true
		}
	}
	return false, true
}
