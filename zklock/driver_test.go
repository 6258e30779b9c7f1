package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

func TestBasics(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d1 := dial(t, servers)
	d2 := dial(t, servers)
	ctx := context.Background()
	key := uniqueKey(t)

	if got := d1.SessionTTL(); got != testTimeout {
		t.Errorf("SessionTTL = %v, want %v", got, testTimeout)
	}
	l1 := lockFor(t, key)
	g1, err := d1.TryAcquire(ctx, l1)
	if err != nil {
		t.Fatal(err)
	}
	if g1.TTL != testTimeout || g1.Fence == 0 {
		t.Errorf("grant %+v", g1)
	}
	// The fence is the node's creation zxid.
	_, path, err := holderSession(d1.conn, d1, key)
	if err != nil {
		t.Fatal(err)
	}
	_, st, err := d1.conn.Exists(path)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(st.Czxid) != g1.Fence {
		t.Errorf("fence %d, Czxid %d", g1.Fence, st.Czxid)
	}
	if st.EphemeralOwner != d1.conn.SessionID() {
		t.Errorf("owner %#x, session %#x", st.EphemeralOwner, d1.conn.SessionID())
	}

	l2 := lockFor(t, key)
	if _, err := d2.TryAcquire(ctx, l2); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	if n := entries(t, d1, key); n != 1 {
		t.Errorf("%d nodes after a failed TryAcquire, want 1", n)
	}
	if err := d2.Refresh(ctx, l2); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh by non-holder: %v", err)
	}
	if err := d2.Release(ctx, l2); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release by non-holder: %v", err)
	}
	// A driver that did not grant it can still check and release by token.
	l1.Fence = g1.Fence
	if err := d2.Refresh(ctx, l1); err != nil {
		t.Errorf("Refresh by token from another driver: %v", err)
	}
	if err := d1.Refresh(ctx, l1); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	if err := d1.Release(ctx, l1); err != nil {
		t.Fatal(err)
	}
	if err := d1.Release(ctx, l1); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("second Release: %v", err)
	}
	g2, err := d2.TryAcquire(ctx, l2)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g1.Fence {
		t.Errorf("fence %d after %d", g2.Fence, g1.Fence)
	}
	// Fences keep increasing when the name's node is deleted and made
	// again (sequence numbers restart).
	if err := d2.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
	if err := d1.conn.Delete(d1.parentPath(key), -1); err != nil {
		t.Fatal(err)
	}
	l4 := lockFor(t, key)
	g4, err := d1.TryAcquire(ctx, l4)
	if err != nil {
		t.Fatal(err)
	}
	if g4.Fence <= g2.Fence {
		t.Errorf("fence %d after %d, across a new parent", g4.Fence, g2.Fence)
	}
	if _, path, _ := holderSession(d1.conn, d1, key); !strings.HasSuffix(path, "-0000000000") {
		t.Errorf("holder %s: the sequence should have restarted", path)
	}
	// A requested TTL longer than the session's is reported as such.
	l3 := lockFor(t, key+"/long")
	l3.TTL = time.Hour
	g3, err := d1.TryAcquire(ctx, l3)
	if err != nil {
		t.Fatal(err)
	}
	if g3.TTL != time.Hour {
		t.Errorf("TTL %v, want 1h", g3.TTL)
	}
}

func entries(t testing.TB, d *Driver, key string) int {
	t.Helper()
	return len(children(t, d, d.parentPath(key)))
}

// children lists parent's nodes, caught up with the leader.
func children(t testing.TB, d *Driver, parent string) []string {
	t.Helper()
	if _, err := d.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
	names, _, err := d.conn.Children(parent)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatal(err)
	}
	return names
}

func TestExpireFiresLost(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	d1 := dial(t, servers)
	d2 := dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	lost := make(chan error, 1)
	l1 := lockFor(t, key)
	l1.OnLost = func(err error) { lost <- err }
	if _, err := d1.TryAcquire(ctx, l1); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, d2, lockFor(t, key))
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := expireKey(ctx, servers, d2, key); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter acquired %v after the expiry", time.Since(start))
	case <-time.After(testTimeout):
		t.Fatal("waiter did not acquire within the session timeout")
	}
	select {
	case err := <-lost:
		if !errors.Is(err, backend.ErrLost) {
			t.Errorf("lost with %v", err)
		}
		t.Logf("lost after %v: %v", time.Since(start), err)
	case <-time.After(testTimeout):
		t.Fatal("no lost signal within the session timeout")
	}
	if err := d1.Release(ctx, l1); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after expiry: %v", err)
	}
}

func TestACLStopsTheft(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	// A root of alice's own: the shared test root is world-writable, and
	// the driver refuses to lock under a root with another ACL than its
	// own (acl.go).
	root := "/locker-test-acl-" + newToken(t)[:8]
	alice := dial(t, servers, WithRoot(root), WithDigestAuth("alice", "s3cret"))
	bob := dial(t, servers, WithRoot(root), WithDigestAuth("alice", "s3cret")) // another process with the credential
	defer deleteTree(alice.conn, root)
	ctx := context.Background()
	key := uniqueKey(t)

	l := lockFor(t, key)
	if _, err := alice.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	thief := func(auth string) *zk.Conn {
		conn, _, err := zk.Connect(servers, testTimeout, zk.WithLogInfo(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := waitSession(cctx, conn); err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			if err := conn.AddAuth("digest", []byte(auth)); err != nil {
				t.Fatal(err)
			}
		}
		return conn
	}
	eve := thief("")                // no credential
	mallory := thief("alice:guess") // a wrong password
	_, path, err := holderSession(eve, alice, key)
	if err != nil {
		t.Fatalf("others can still read the queue: %v", err)
	}
	for name, conn := range map[string]*zk.Conn{"no credential": eve, "wrong password": mallory} {
		if err := conn.Delete(path, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s: deleting the holder's node = %v, want ErrNoAuth", name, err)
		}
		if _, err := conn.Set(path, []byte("mine"), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s: writing the holder's node = %v, want ErrNoAuth", name, err)
		}
		if _, err := conn.Create(alice.parentPath(key)+"/lk-squat-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s: queueing under the holder = %v, want ErrNoAuth", name, err)
		}
	}
	// A driver without the credential cannot even open under the root.
	for name, opts := range map[string][]Option{"no credential": nil, "wrong password": {WithDigestAuth("alice", "guess")}} {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := dialDriver(dctx, servers, append([]Option{WithRoot(root)}, opts...)...)
		cancel()
		if !errors.Is(err, backend.ErrPermission) {
			t.Errorf("%s: Dial under alice's root = %v, want ErrPermission", name, err)
		}
	}
	if n := entries(t, alice, key); n != 1 {
		t.Fatalf("%d nodes in the queue, want the holder's only", n)
	}
	l2 := lockFor(t, key)
	if _, err := bob.TryAcquire(ctx, l2); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a client with the credential: TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := alice.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.TryAcquire(ctx, l2); err != nil {
		t.Fatalf("a client with the credential, after the release: %v", err)
	}
	acl, _, err := eve.GetACL(alice.parentPath(key))
	if err != nil {
		t.Fatal(err)
	}
	if len(acl) != 2 || acl[0].Scheme != "digest" || acl[1].Scheme != "world" || acl[1].Perms != zk.PermRead {
		t.Errorf("parent ACL %+v", acl)
	}
}

// TestWaiterSessionExpires: a waiter whose session expires (its node goes
// with it) queues again on its new session, at the back, and takes the
// lock when it is released: its Wait says the node is gone
// (backend.ErrRequeue), and the Client queues again.
func TestWaiterSessionExpires(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	holder, waiter := dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := uniqueKey(t)
	hl := lockFor(t, key)
	hg, err := holder.TryAcquire(ctx, hl)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *locker.Lock
		err error
	}
	done := make(chan result, 1)
	c := clientOf(t, waiter)
	go func() {
		l, err := c.Acquire(ctx, nameOf(key))
		done <- result{l, err}
	}()
	for entries(t, holder, key) != 2 {
		time.Sleep(10 * time.Millisecond)
	}
	sid := waiter.conn.SessionID()
	_, g := drivers.bySession(sid)
	_, passwd := drivers.credentials(waiter)
	g.close()
	err = expireSession(servers, sid, passwd)
	g.open()
	if err != nil {
		t.Fatal(err)
	}
	// Generous: the waiter learns of the expiry only when its client
	// reconnects, after a backoff that a loaded machine stretches.
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case r := <-done:
			t.Fatalf("Acquire = %v, %v after its session expired, want it to queue again and wait", r.l, r.err)
		default:
		}
		if now := waiter.conn.SessionID(); now != sid && now != 0 && waitersOf(t, holder, key, now) == 1 && entries(t, holder, key) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter has not queued again on a new session 15 s after its session %#x expired", sid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := holder.Release(ctx, hl); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Acquire = %v, want the lock", r.err)
		}
		if r.l.Fence() <= hg.Fence {
			t.Errorf("the waiter's fence %d is not above the holder's %d", r.l.Fence(), hg.Fence)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the released lock")
	}
}

// waitersOf counts the nodes of key's queue that session sid owns.
func waitersOf(t *testing.T, d *Driver, key string, sid int64) int {
	t.Helper()
	parent := d.parentPath(key)
	names, _, err := d.conn.Children(parent)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range names {
		ok, st, err := d.conn.Exists(parent + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if ok && st.EphemeralOwner == sid {
			n++
		}
	}
	return n
}

// dropConn loses the response to the armed-th next multi-op: it discards
// what the server sends once that request is out, and hangs up.
type dropConn struct {
	net.Conn
	armed *atomic.Int32
	drop  atomic.Bool
	hits  *atomic.Int32
}

func (c *dropConn) Write(p []byte) (int, error) {
	if len(p) >= 12 && int32(binary.BigEndian.Uint32(p[8:12])) == 14 && c.armed.Load() > 0 && c.armed.Add(-1) == 0 {
		c.drop.Store(true)
		c.hits.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *dropConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.drop.Load() {
		c.Conn.Close()
		return 0, errors.New("test: response dropped")
	}
	return n, err
}

func TestLostCreateResponseFound(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	var armed, hits atomic.Int32
	var logs syncBuffer
	d := dial(t, servers, WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &dropConn{Conn: c, armed: &armed, hits: &hits}, nil
	}), WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A lock's node, a permit's and a reader's: the same code makes them.
	// The Client waits: the Enqueue's ticket finds the node.
	c := clientOf(t, d)
	kinds := []struct {
		claim func(key string) backend.Claim
		opts  []locker.LockOption
	}{
		{func(key string) backend.Claim { return lockFor(t, key) }, nil},
		{func(key string) backend.Claim { return sharedClaim(t, key, backend.Permit, 2) }, []locker.LockOption{locker.Semaphore(2)}},
		{func(key string) backend.Claim { return sharedClaim(t, key, backend.Read, 0) }, []locker.LockOption{locker.Read()}},
	}
	for _, k := range kinds {
		for _, fresh := range []bool{true, false} {
			key := uniqueKey(t)
			if !fresh {
				l := k.claim(key)
				if _, err := d.TryAcquire(ctx, l); err != nil {
					t.Fatal(err)
				}
				if err := d.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			// Lose the answer to the first multi: on a fresh name, the one
			// that makes the name's node and the queue node together.
			armed.Store(1)
			l := k.claim(key)
			lk, err := c.Acquire(ctx, nameOf(key), k.opts...)
			if err != nil {
				t.Fatalf("Acquire %v with a lost create response (fresh name %v): %v", l.Mode, fresh, err)
			}
			if armed.Load() != 0 {
				t.Fatal("fewer multi-ops were sent than expected")
			}
			n := entries(t, d, key)
			if l.Mode != backend.Exclusive {
				n = sharedEntries(t, d, l)
			}
			if n != 1 {
				t.Fatalf("%d nodes after a lost create response (%v), want 1", n, l.Mode)
			}
			_, path, _ := holderSession(d.conn, d, key)
			_, st, err := d.conn.Exists(path)
			if err != nil || uint64(st.Czxid) != lk.Fence() {
				t.Fatalf("fence %d, node %+v, %v", lk.Fence(), st, err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if hits.Load() != 6 {
		t.Fatalf("%d responses dropped, want 6", hits.Load())
	}
	// The server made every node, and the driver found them again.
	if n := strings.Count(logs.String(), "found the node of a lost create response"); n != 6 {
		t.Errorf("%d nodes found again, want 6", n)
	}
}

type syncBuffer = testutil.SyncBuffer

// freezer cuts a driver off from the servers without closing anything:
// what it sends is dropped, nothing reaches it, and it cannot dial.
type freezer struct {
	gate
	frozen atomic.Bool
}

func (f *freezer) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := f.gate.dialer(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &frozenConn{Conn: c, f: f}, nil
}

func (f *freezer) freeze() { f.gate.close(); f.frozen.Store(true) }

func (f *freezer) thaw() { f.frozen.Store(false); f.gate.open() }

type frozenConn struct {
	net.Conn
	f *freezer
}

func (c *frozenConn) Write(p []byte) (int, error) {
	if c.f.frozen.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *frozenConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if !c.f.frozen.Load() || err != nil {
			return n, err
		}
	}
}

// TestPartitionedHolderLosesFirst: a holder cut off from ZooKeeper hears
// that its lock is lost before the server expires its session and another
// client takes the lock.
func TestPartitionedHolderLosesFirst(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	f := &freezer{}
	holder := dial(t, servers, WithDialer(f.dialer))
	t.Cleanup(f.thaw)
	other := dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := uniqueKey(t)
	lostAt := make(chan time.Time, 1)
	l := lockFor(t, key)
	l.OnLost = func(error) { lostAt <- time.Now() }
	if _, err := holder.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		if _, err := acquire(ctx, other, lockFor(t, key)); err != nil {
			t.Error(err)
		}
		got <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	frozen := time.Now()
	f.freeze()
	var lost, taken time.Time
	select {
	case lost = <-lostAt:
	case <-time.After(3 * testTimeout):
		t.Fatal("no lost signal")
	}
	select {
	case taken = <-got:
	case <-time.After(3 * testTimeout):
		t.Fatal("the other client never got the lock")
	}
	t.Logf("cut off at 0, lost signal at %v, the other client got the lock at %v (session timeout %v)",
		lost.Sub(frozen), taken.Sub(frozen), testTimeout)
	if !lost.Before(taken) {
		t.Errorf("the other client got the lock before the holder heard it lost it")
	}
	f.thaw()
	if err := holder.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the session expired: %v", err)
	}
}

// TestNewDetectsExpiry: with a connection the caller built, the driver
// polls it, and reports the loss when the session expires.
func TestNewDetectsExpiry(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	g := &gate{}
	conn, _, err := zk.Connect(servers, testTimeout, zk.WithLogInfo(false), zk.WithDialer(g.dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := waitSession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := New(conn); err != nil {
		t.Fatalf("New: %v", err) // the default root
	}
	d, err := New(conn, WithRoot("/locker-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	lost := make(chan error, 1)
	l := lockFor(t, key)
	l.OnLost = func(err error) { lost <- err }
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	sid, passwd := g.spy.credentials()
	g.close()
	start := time.Now()
	err = expireSession(servers, sid, passwd)
	g.open()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, backend.ErrLost) {
			t.Errorf("lost with %v", err)
		}
		t.Logf("lost after %v: %v", time.Since(start), err)
	case <-time.After(testTimeout):
		t.Fatal("no lost signal within the session timeout")
	}
	if err := d.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release after the expiry: %v", err)
	}
}

// TestNewCloseLeavesQueue: on a connection the caller passed, which
// outlives the driver, a waiter's node goes when Close ends the wait, so
// that nobody waits behind it for as long as the caller's session lives.
func TestNewCloseLeavesQueue(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	conn, _, err := zk.Connect(servers, testTimeout, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := New(conn, WithRoot("/locker-test"), WithSessionTimeout(testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	holder := dial(t, servers)
	key := uniqueKey(t)
	if _, err := holder.TryAcquire(ctx, lockFor(t, key)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	c := clientOf(t, d)
	go func() {
		_, err := c.Acquire(ctx, nameOf(key))
		done <- err
	}()
	for entries(t, holder, key) != 2 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Acquire during Close = %v, want ErrClosed", err)
	}
	if n := entries(t, holder, key); n != 1 {
		t.Fatalf("%d nodes in the queue after Close ended the wait, want the holder's only", n)
	}
}
