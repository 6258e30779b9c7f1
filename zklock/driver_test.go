package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
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
	names, _, err := d.conn.Children(d.parentPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
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
		_, err := d2.Acquire(ctx, lockFor(t, key))
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
