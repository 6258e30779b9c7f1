package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// A waiter for a lock held elsewhere is served when the holder's TTL runs
// out, which notifies nobody.
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
	c, err := locker.New(d, locker.WithNamespace("ns"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "expiry")
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("granted %v after the holder's acquisition was sent, before its TTL of 300ms ran out", waited)
	}
	if err := l.Release(ctx); err != nil {
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
	heard := spy(t, ctx, h)
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

// Break of a permit notifies as its release would, while someone waits
// for the key; under a fence that no holder has, it frees nothing and
// notifies nobody.
func TestBreakHolderNotifies(t *testing.T) {
	t.Parallel()
	key := "ns/broken"
	d, ctx, heard := waited(t, key)
	g, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Break(ctx, key, backend.Permit, g.Fence+1); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Break under another fence = %v, want ErrNotHeld", err)
	}
	if heard(300 * time.Millisecond) {
		t.Fatal("a Break that freed nothing notified")
	}
	if _, err := d.Break(ctx, key, backend.Permit, g.Fence); err != nil {
		t.Fatal(err)
	}
	if !heard(5 * time.Second) {
		t.Fatal("a Break with a subscriber did not notify")
	}
}

// waited returns a driver with a subscriber of key, a context that ends
// at cleanup or in 30 s, and a spy of the driver's channel.
func waited(t *testing.T, key string) (*Driver, context.Context, func(within time.Duration) bool) {
	t.Helper()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	heard := spy(t, ctx, h)
	_, unsubscribe, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unsubscribe)
	return d, ctx, heard
}

// spy listens on h's channel on a connection of its own, closed at
// cleanup, and returns whether a notification comes within a time.
func spy(t *testing.T, ctx context.Context, h *harness) func(within time.Duration) bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, h.sql.listen); err != nil {
		t.Fatal(err)
	}
	return func(within time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		_, err := conn.WaitForNotification(wctx)
		return err == nil
	}
}

// Resize notifies as a release does while someone waits for the key: a
// raised limit lets waiters in.
func TestResizeNotifies(t *testing.T) {
	t.Parallel()
	key := "ns/resized"
	d, ctx, heard := waited(t, key)
	t.Cleanup(func() { d.Resize(context.Background(), key, 0) })
	if err := d.Resize(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	if !heard(5 * time.Second) {
		t.Fatal("a Resize with a subscriber did not notify")
	}
}
