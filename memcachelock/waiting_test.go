package memcachelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// waitingClient is a Client on a driver of its own, and the driver.
func waitingClient(t *testing.T, ns string) (*locker.Client, *Driver) {
	t.Helper()
	d := openDriver(t, testenv.MemcacheAddr())
	c, err := locker.New(d, locker.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, d
}

type acquired struct {
	l   *locker.Lock
	err error
	at  time.Time
}

func acquireAsync(ctx context.Context, c *locker.Client, name string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, name)
		ch <- acquired{l, err, time.Now()}
	}()
	return ch
}

// within polls cond every millisecond for at most d.
func within(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// subscribed is how many of d's waiters watch key.
func subscribed(d *Driver, key string) int {
	d.waits.mu.Lock()
	defer d.waits.mu.Unlock()
	if kw := d.waits.keys[key]; kw != nil {
		return len(kw.subs)
	}
	return 0
}

// A waiter on the same Client is served before the releaser, who comes
// back at once, and is woken by the release, not by its backoff.
func TestLocalWaiterBeforeReleaser(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	c, d := waitingClient(t, ns)
	l, err := c.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, c, "x")
	if !within(5*time.Second, func() bool { return subscribed(d, backend.Key(ns, "x")) == 1 }) {
		t.Fatal("the waiter did not wait")
	}
	// Long enough for the waiter's backoff to grow well past the bound
	// below (2ms doubling, capped at 250ms).
	time.Sleep(600 * time.Millisecond)
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again := acquireAsync(ctx, c, "x")
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if wait := a.at.Sub(released); wait > 150*time.Millisecond {
		t.Fatalf("the waiter got the lock %v after the release: not woken by it", wait)
	}
	select {
	case b := <-again:
		t.Fatalf("the releaser's Acquire returned (%v) while the waiter it released to holds", b.err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if b := <-again; b.err != nil {
		t.Fatal(b.err)
	} else {
		b.l.Release(ctx)
	}
}

// A waiter on another driver marks the holder's item, and the holder's
// driver leaves it the lock: its releaser does not take it back.
func TestRemoteWaiterTakesItsTurn(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	ca, da := waitingClient(t, ns)
	cb, _ := waitingClient(t, ns)
	l, err := ca.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	lk := lockKey(backend.Key(ns, "x"))
	got := acquireAsync(ctx, cb, "x")
	if !within(5*time.Second, func() bool {
		it, err := da.mc.Get(lk)
		return err == nil && marked(it.Value) != ""
	}) {
		t.Fatal("the remote waiter did not mark the holder's item")
	}
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := ca.TryAcquire(ctx, "x"); !errors.Is(err, locker.ErrNotAcquired) {
		if again != nil {
			again.Release(ctx)
		}
		t.Fatalf("the releaser's TryAcquire with a remote waiter marked = %v, want ErrNotAcquired", err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if wait := a.at.Sub(released); wait > yieldWindow {
		t.Fatalf("the remote waiter got the lock %v after the release, more than the yield window %v", wait, yieldWindow)
	}
	if a.l.Fence() <= l.Fence() {
		t.Fatalf("fence %d after %d", a.l.Fence(), l.Fence())
	}
	if err := a.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Once the waiter has had its turn, the first driver takes the lock
	// again at once.
	if l, err := ca.TryAcquire(ctx, "x"); err != nil {
		t.Fatalf("TryAcquire after the remote waiter's turn: %v", err)
	} else {
		l.Release(ctx)
	}
}

// Marks change nothing about who holds: the holder refreshes and releases
// over them, Inspect does not show them, a tombstone with a mark is free,
// and a second driver is refused.
func TestMarksKeepTheHold(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, other := openDriver(t, testenv.MemcacheAddr()), openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	lk := lockKey(key)
	l := backend.Claim{Key: key, Token: token(), TTL: time.Second, Owner: "job"}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := d.mc.Append(&memcache.Item{Key: lk, Value: []byte(markSep + token())}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Refresh(ctx, l); err != nil {
		t.Fatalf("Refresh over marks: %v", err)
	}
	st, err := other.Inspect(ctx, key, backend.Exclusive)
	if err != nil || !st.Held || st.Owner != "job" || st.Fence != g.Fence {
		t.Fatalf("Inspect over marks = %+v, %v; want held by owner %q with fence %d", st, err, "job", g.Fence)
	}
	if _, err := other.TryAcquire(ctx, backend.Claim{Key: key, Token: token(), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("another driver's TryAcquire over a marked hold = %v, want ErrNotAcquired", err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release over marks: %v", err)
	}
	if _, err := d.mc.Get(lk); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("after Release, Get = %v; want a miss", err)
	}
	// A server that kept a tombstone to which a waiter appended its mark.
	if err := d.mc.Set(&memcache.Item{Key: lk, Value: []byte(tombstone + markSep + token()), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	l2 := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	if _, err := other.TryAcquire(ctx, l2); err != nil {
		t.Fatalf("TryAcquire over a marked tombstone: %v", err)
	}
	if err := other.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
}

// An evicted holder's item takes its waiter's mark with it: the waiter
// gets the lock (woken by the poller), and the old holder finds the loss;
// never two holders.
func TestEvictedMarkedHold(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	ca, da := waitingClient(t, ns)
	cb, _ := waitingClient(t, ns)
	l, err := ca.TryAcquire(ctx, "x", locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	lk := lockKey(backend.Key(ns, "x"))
	got := acquireAsync(ctx, cb, "x")
	if !within(5*time.Second, func() bool {
		it, err := da.mc.Get(lk)
		return err == nil && marked(it.Value) != ""
	}) {
		t.Fatal("the remote waiter did not mark the holder's item")
	}
	if err := da.mc.Delete(lk); err != nil {
		t.Fatal(err)
	}
	var a acquired
	select {
	case a = <-got:
	case <-time.After(time.Second):
		t.Fatal("the waiter did not get the evicted lock within 1s")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.l.Release(ctx)
	if err := l.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) && !errors.Is(err, locker.ErrLost) {
		t.Fatalf("the evicted holder's Refresh = %v, want the loss", err)
	}
	if _, err := ca.TryAcquire(ctx, "x"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire while the waiter holds = %v, want ErrNotAcquired", err)
	}
}

// The waiting state of keys nobody waits for any more is swept: it does
// not grow with the keys.
func TestWaitingStateIsSwept(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	for i := range 1000 {
		_, cancel, err := d.Subscribe(ctx, fmt.Sprint(key, "-", i))
		if err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	d.waits.mu.Lock()
	n := len(d.waits.keys)
	d.waits.mu.Unlock()
	if n > 200 {
		t.Fatalf("%d keys' waiting state kept after 1000 ended waits", n)
	}
}

// A waiter that gives up takes its mark off the holder's item, so that
// the holder's driver does not leave the lock to nobody.
func TestEndedWaitUnmarks(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	ca, da := waitingClient(t, ns)
	cb, _ := waitingClient(t, ns)
	l, err := ca.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	lk := lockKey(backend.Key(ns, "x"))
	hasMark := func() bool {
		it, err := da.mc.Get(lk)
		return err == nil && marked(it.Value) != ""
	}
	wctx, cancel := context.WithCancel(ctx)
	got := acquireAsync(wctx, cb, "x")
	if !within(5*time.Second, hasMark) {
		t.Fatal("the remote waiter did not mark the holder's item")
	}
	cancel()
	if a := <-got; !errors.Is(a.err, locker.ErrNotAcquired) {
		t.Fatalf("the cancelled wait = %v, want ErrNotAcquired", a.err)
	}
	if !within(5*time.Second, func() bool { return !hasMark() }) {
		t.Fatal("the ended wait's mark stayed on the holder's item")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := ca.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatalf("the releaser's TryAcquire with no waiter left: %v", err)
	}
	again.Release(ctx)
}

// Withdrawing a mark keeps the holder's expiry: an abandoned lock still
// frees within its TTL and the granularity.
func TestUnmarkKeepsExpiry(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	lk := lockKey(key)
	l := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, unsubscribe, err := d.Subscribe(ctx, key) // a waiter's
	if err != nil {
		t.Fatal(err)
	}
	it, err := d.mc.Get(lk)
	if err != nil {
		t.Fatal(err)
	}
	d.foundHeld(ctx, key, it.Value)
	if it, err := d.mc.Get(lk); err != nil || marked(it.Value) == "" {
		t.Fatalf("the waiter's try did not mark the holder's item: %v", err)
	}
	unsubscribe() // the wait ended: withdraw
	if !within(5*time.Second, func() bool {
		it, err := d.mc.Get(lk)
		return err == nil && bytes.Contains(it.Value, []byte(markSep+unmarkTag)) && marked(it.Value) == ""
	}) {
		t.Fatal("the mark was not withdrawn")
	}
	limit := l.TTL + expirationMargin*time.Second + 500*time.Millisecond
	if !within(limit, func() bool {
		_, err := d.mc.Get(lk)
		return errors.Is(err, memcache.ErrCacheMiss)
	}) {
		t.Fatalf("the abandoned lock was still there %v after its acquisition", time.Since(start))
	}
}

func TestMarked(t *testing.T) {
	v := fencedValue("aa", 3, "owner")
	for _, c := range []struct {
		marks string
		want  string
	}{
		{"", ""},
		{markSep + "bb", "bb"},
		{markSep + "bb" + markSep + "cc", "bb"},
		{markSep + "bb" + markSep + unmarkTag + "bb", ""},
		{markSep + "bb" + markSep + unmarkTag + "bb" + markSep + "cc", "cc"},
		{markSep + "bb" + markSep + unmarkTag + "b", "bb"},
	} {
		if got := marked(append(v, c.marks...)); got != c.want {
			t.Errorf("marked(%q) = %q, want %q", c.marks, got, c.want)
		}
	}
}
