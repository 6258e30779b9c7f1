package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/backend"
)

// queued returns how many of this driver's waiters queue for key.
func (qs *queues) queued(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.keys[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// waitQueued waits until n of d's waiters queue for key.
func waitQueued(t *testing.T, d *Driver, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.queues.queued(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters queued for %s, want %d", d.queues.queued(key), key, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type waitResult struct {
	i   int
	c   backend.Claim
	err error
}

// A process's waiters are served in arrival order; one that gives up
// leaves its place to the next; a releaser that comes back waits behind
// those already waiting.
func TestLocalWaitersInArrivalOrder(t *testing.T) {
	t.Parallel()
	d, _ := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "ns/order"
	claim := func() backend.Claim { return backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute} }
	holder := claim()
	g, err := d.Acquire(ctx, holder)
	if err != nil {
		t.Fatal(err)
	}
	holder.Fence = g.Fence
	if n := d.queues.queued(key); n != 0 {
		t.Fatalf("%d waiters queued after an uncontended Acquire, want 0", n)
	}

	got := make(chan waitResult, 4)
	start := func(ctx context.Context, i int) {
		go func() {
			c := claim()
			g, err := d.Acquire(ctx, c)
			c.Fence = g.Fence
			got <- waitResult{i, c, err}
		}()
	}
	cctx, cancelSecond := context.WithCancel(ctx)
	for i := range 3 {
		wctx := ctx
		if i == 1 {
			wctx = cctx
		}
		start(wctx, i)
		waitQueued(t, d, key, i+1)
	}
	cancelSecond()
	if r := <-got; r.i != 1 || !errors.Is(r.err, backend.ErrNotAcquired) {
		t.Fatalf("cancelled waiter: waiter %d, %v; want waiter 1, ErrNotAcquired", r.i, r.err)
	}
	waitQueued(t, d, key, 2)

	if err := d.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first.i != 0 || first.err != nil {
		t.Fatalf("first served: waiter %d, %v; want waiter 0", first.i, first.err)
	}
	// The releaser comes back, behind waiter 2.
	waitQueued(t, d, key, 1)
	start(ctx, 3)
	waitQueued(t, d, key, 2)
	if err := d.Release(ctx, first.c); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second.i != 2 || second.err != nil {
		t.Fatalf("second served: waiter %d, %v; want waiter 2", second.i, second.err)
	}
	if err := d.Release(ctx, second.c); err != nil {
		t.Fatal(err)
	}
	third := <-got
	if third.i != 3 || third.err != nil {
		t.Fatalf("third served: waiter %d, %v; want waiter 3", third.i, third.err)
	}
	if err := d.Release(ctx, third.c); err != nil {
		t.Fatal(err)
	}
	if n := d.queues.queued(key); n != 0 {
		t.Fatalf("%d waiters left queued, want 0", n)
	}
}

// The first local waiter of a lock held elsewhere is served when the
// holder's TTL runs out, which notifies nobody.
func TestLocalWaiterSeesExpiry(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	other, err := Open(context.Background(), h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "ns/expiry"
	// The holder's TTL runs from its grant, after start: counted from a
	// time taken once TryAcquire returned, a loaded machine's round trip
	// would shorten it.
	start := time.Now()
	if _, err := other.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	c := backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute}
	g, err := d.Acquire(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("granted %v after the holder's acquisition was sent, before its TTL of 300ms ran out", waited)
	}
	c.Fence = g.Fence
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// A release notifies only while someone waits for its key: a subscriber
// makes the key present, until presenceLinger after it left.
func TestReleaseNotifiesOnlyWaiters(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spy, err := pgx.Connect(ctx, baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close(context.Background())
	if _, err := spy.Exec(ctx, h.sql.listen); err != nil {
		t.Fatal(err)
	}
	key := "ns/present"
	cycle := func() {
		t.Helper()
		c := backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	heard := func(within time.Duration) bool {
		wctx, wcancel := context.WithTimeout(ctx, within)
		defer wcancel()
		_, err := spy.WaitForNotification(wctx)
		return err == nil
	}
	cycle()
	if heard(300 * time.Millisecond) {
		t.Fatal("a release that nobody waited for notified")
	}
	_, unsubscribe, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cycle()
	if !heard(5 * time.Second) {
		t.Fatal("a release with a subscriber did not notify")
	}
	unsubscribe()
	time.Sleep(presenceLinger)
	// The key goes at the sweep after presenceLinger.
	deadline := time.Now().Add(5 * time.Second)
	for {
		cycle()
		if !heard(300 * time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("releases still notify long after the last subscriber left")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
