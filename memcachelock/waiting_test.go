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

func queued(d *Driver, key string) int {
	d.waits.mu.Lock()
	defer d.waits.mu.Unlock()
	if kw := d.waits.keys[key]; kw != nil {
		return len(kw.queue)
	}
	return 0
}

// A waiter on the same driver is served before the releaser, who comes
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
	if !within(5*time.Second, func() bool { return queued(d, backend.Key(ns, "x")) == 1 }) {
		t.Fatal("the waiter did not queue")
	}
	// Long enough for the waiter's backoff to grow well past the bound
	// below (2ms doubling, capped at 250ms).
	time.Sleep(600 * time.Millisecond)
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := c.TryAcquire(ctx, "x"); !errors.Is(err, locker.ErrNotAcquired) {
		if again != nil {
			again.Release(ctx)
		}
		t.Fatalf("the releaser's TryAcquire with a waiter queued = %v, want ErrNotAcquired", err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.l.Release(ctx)
	if wait := a.at.Sub(released); wait > 150*time.Millisecond {
		t.Fatalf("the waiter got the lock %v after the release: not woken by it", wait)
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
	st, err := other.Inspect(ctx, key)
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

// The waiting state of keys nobody comes back to (a TryAcquire that failed
// once, a hold never released) is swept: it does not grow with the keys.
func TestWaitingStateIsSwept(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	d := openDriver(t, testenv.MemcacheAddr())
	past := time.Now().Add(-2 * onceFor)
	for i := range 1000 {
		d.failed(fmt.Sprint("once-", i), token(), nil, past)
		d.failed(fmt.Sprint("held-", i), token(), nil, past)
		d.granted(fmt.Sprint("held-", i), token(), past)
	}
	d.waits.mu.Lock()
	n := len(d.waits.keys)
	d.waits.mu.Unlock()
	if n > 200 {
		t.Fatalf("%d keys' waiting state kept after 2000 lapsed ones", n)
	}
}

// On one driver, waiters (tokens that failed twice, with a subscription)
// are served in order,
// and a token that comes after them, the releaser's next one, is refused
// while the key is free in the store.
func TestLocalOrder(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	claim := func() backend.Claim { return backend.Claim{Key: key, Token: token(), TTL: time.Second} }
	h, w1, w2, r := claim(), claim(), claim(), claim()
	if _, err := d.TryAcquire(ctx, h); err != nil {
		t.Fatal(err)
	}
	// Waiters subscribe, as the locker package's do.
	for range 2 {
		_, cancel, err := d.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
	}
	for _, w := range []backend.Claim{w1, w1, w2, w2} {
		if _, err := d.TryAcquire(ctx, w); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("TryAcquire while held = %v, want ErrNotAcquired", err)
		}
	}
	if err := d.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	for _, c := range []backend.Claim{r, w2} {
		if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a token behind the first waiter = %v, want ErrNotAcquired", err)
		}
	}
	if _, err := d.TryAcquire(ctx, w1); err != nil {
		t.Fatalf("the first waiter's TryAcquire: %v", err)
	}
	if err := d.Release(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, w2); err != nil {
		t.Fatalf("the second waiter's TryAcquire: %v", err)
	}
	if err := d.Release(ctx, w2); err != nil {
		t.Fatal(err)
	}
	// r failed once only (a TryAcquire, not a wait): it was never queued.
	if _, err := d.TryAcquire(ctx, r); err != nil {
		t.Fatalf("the last waiter's TryAcquire: %v", err)
	}
	if err := d.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
}

// A queue whose waiters have all unsubscribed is of waits that ended,
// even before their tokens' releases arrive: it does not hold up the next
// token.
func TestEndedWaitsDoNotQueue(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	h := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	w := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, h); err != nil {
		t.Fatal(err)
	}
	_, cancel, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := d.TryAcquire(ctx, w); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("TryAcquire while held = %v, want ErrNotAcquired", err)
		}
	}
	if n := queued(d, key); n != 1 {
		t.Fatalf("%d queued, want the waiter", n)
	}
	cancel()
	if err := d.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	r := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, r); err != nil {
		t.Fatalf("TryAcquire after the only waiter unsubscribed: %v", err)
	}
	if err := d.Release(ctx, r); err != nil {
		t.Fatal(err)
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
	w := token()
	d.mark(key, w)
	d.lost(key, w) // the wait ended: withdraw
	if !within(5*time.Second, func() bool {
		it, err := d.mc.Get(lk)
		return err == nil && bytes.Contains(it.Value, []byte(markSep+unmarkTag+w)) && marked(it.Value) == ""
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
