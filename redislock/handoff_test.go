package redislock

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// queueFake puts a waiter that is not running in key's queue, as its try
// would: c's attempt n, named w.
func queueFake(t *testing.T, d *Driver, c backend.Claim, n uint64, w string) {
	t.Helper()
	r, err := d.dep.queueAcquire(testCtx(t), false, c, c.Token+"."+strconv.FormatUint(n, 10), ttlMillis(c.TTL), w, "wait")
	if err != nil || r > 0 {
		t.Fatalf("queueing %s: %d, %v", w, r, err)
	}
}

// lockValue is key's lock value, "" when free.
func lockValue(t *testing.T, d *Driver, key string) string {
	t.Helper()
	v, err := d.Client().Get(testCtx(t), keysFor(key).lock).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

// A release with a waiter queued gives the lock to it: the key is never
// free, so a try in between fails; the waiter's grant has a greater fence,
// and Sent before the release. Nothing of the queue is left after.
// The waiter is in another process (told by pub/sub), or in the
// releaser's (told by the release's reply).
func TestHandoffGoesToTheWaiter(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	t.Run("other", func(t *testing.T) { handoffToWaiter(t, openDriver(t), openDriver(t)) })
	d := openDriver(t)
	t.Run("same", func(t *testing.T) { handoffToWaiter(t, d, d) })
}

func handoffToWaiter(t *testing.T, d1, d2 *Driver) {
	ctx := testCtx(t)
	key := uniqueKey(t)
	claim := func() backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second, Owner: "o"}
	}
	a, b := claim(), claim()
	ga, err := d1.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	got := queueInBackground(t, ctx, d1, d2, b)
	released := time.Now()
	if err := d1.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if v := lockValue(t, d1, key); !strings.HasPrefix(v, b.Token+".") {
		t.Fatalf("after the release the lock holds %q, want the waiter's", v)
	}
	if _, err := d1.TryAcquire(ctx, claim()); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a try after the hand-off: %v, want ErrNotAcquired", err)
	}
	var r queuedResult
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not return within 5s of the hand-off")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Fence <= ga.Fence || r.g.Sent.IsZero() {
		t.Fatalf("the waiter's grant %+v: want a fence above %d, and when it was sent", r.g, ga.Fence)
	}
	// The server keeps the lock at least as long as the waiter believes
	// (its TTL from Sent), whichever way it learnt of the grant.
	pttl, err := d1.Client().PTTL(ctx, keysFor(key).lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	if believed := time.Until(r.g.Sent.Add(r.g.TTL)); believed > pttl+2*time.Millisecond {
		t.Fatalf("the waiter believes it holds the lock %v more, the server keeps it %v", believed, pttl)
	}
	t.Logf("released %v, grant sent %v after it", released.Format(time.StampMicro), r.g.Sent.Sub(released))
	st, err := d1.Inspect(ctx, key, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Fence != r.g.Fence || st.Owner != "o" || st.Waiters != 0 {
		t.Fatalf("Inspect after the hand-off: %+v", st)
	}
	if err := d2.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	k := keysFor(key)
	if n, err := d1.Client().Exists(ctx, k.lock, k.queue, k.live, k.hand).Result(); err != nil || n != 0 {
		t.Fatalf("after the last release %d of the lock's and queue's keys are left (%v)", n, err)
	}
}

// A waiter that stopped renewing is skipped: the release frees the lock.
func TestHandoffSkipsDeadWaiter(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	key := uniqueKey(t)
	a := backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second}
	if _, err := d.TryAcquire(ctx, a); err != nil {
		t.Fatal(err)
	}
	dead := backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second}
	queueFake(t, d, dead, attempts.Add(1), "dead:")
	// Its liveness ran out (server time, ms).
	if err := d.Client().HSet(ctx, keysFor(key).live, "dead:", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if v := lockValue(t, d, key); v != "" {
		t.Fatalf("the lock went to a dead waiter: %q", v)
	}
	if err := d.Release(ctx, a); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatal(err)
	}
}

// A waiter that gives up after the lock was handed to it hands it on, to
// the next live waiter or, with none, frees it; fences increase throughout.
func TestHandoffLeaveHandsOn(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	key := uniqueKey(t)
	claim := func() backend.Claim { return backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second} }
	a, w1, w2 := claim(), claim(), claim()
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := attempts.Add(1), attempts.Add(1)
	queueFake(t, d, w1, n1, "w1:")
	queueFake(t, d, w2, n2, "w2:")
	fence := g.Fence
	holds := func(c backend.Claim, n uint64) {
		t.Helper()
		v := lockValue(t, d, key)
		h, ok := parseValue(v, 1)
		if !strings.HasPrefix(v, c.Token+"."+strconv.FormatUint(n, 10)+":") || !ok || h.fence <= fence {
			t.Fatalf("the lock holds %q, want attempt %d of %s with a fence above %d", v, n, c.Token, fence)
		}
		fence = h.fence
	}
	if err := d.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	holds(w1, n1)
	d.dep.handoffLeave(ctx, w1, n1, n1, "w1:")
	holds(w2, n2)
	d.dep.handoffLeave(ctx, w2, n2, n2, "w2:")
	if v := lockValue(t, d, key); v != "" {
		t.Fatalf("the last waiter left, and the lock holds %q", v)
	}
	g, err = d.TryAcquire(ctx, claim())
	if err != nil || g.Fence <= fence {
		t.Fatalf("TryAcquire once all left: %+v, %v (fence above %d wanted)", g, err, fence)
	}
}

// Only a hand-off to the attempt last answered "queued" is trusted.
func TestHandedToOnlyTheLatestQueuedAttempt(t *testing.T) {
	dep := &deployment{}
	sub := &subscription{handed: []handoff{{attempt: 1, fence: 10}, {attempt: 3, fence: 30}}}
	if f, ok := dep.handedTo(sub, 3); !ok || f != 30 {
		t.Fatalf("handedTo(3) = %d, %v", f, ok)
	}
	if _, ok := dep.handedTo(sub, 2); ok {
		t.Fatal("a hand-off to another attempt was trusted")
	}
	if _, ok := dep.handedTo(sub, 0); ok || len(sub.handed) != 0 {
		t.Fatalf("never queued, and handedTo trusted %v", sub.handed)
	}
	for _, p := range []string{"!1:2:w:o", "!x:2:w", "w", "!1:2"} {
		id, h, ok := parseHandoff(p)
		if ok != (p == "!1:2:w:o") || (ok && (id != "w:o" || h != handoff{1, 2})) {
			t.Errorf("parseHandoff(%q) = %q, %+v, %v", p, id, h, ok)
		}
	}
}

// stallable is a Driver whose new connections dial the server, and whose
// next n requests (n idle connections, taken last in, first out) go
// through p, which a test stalls to hold them back and heals to let them
// land late. A read waits 300ms, and nothing is retried.
func stallable(t *testing.T, n int) (*Driver, *faultproxy.Proxy) {
	t.Helper()
	p := newFaultProxy(t)
	proxied, direct := p.Addr(), testenv.RedisAddr()
	var route atomic.Pointer[string]
	route.Store(&direct)
	d, _ := routedDriver(t, &route, func(o *redis.Options) {
		o.ReadTimeout, o.MaxRetries = 300*time.Millisecond, -1
	})
	// The script, loaded now: a NOSCRIPT answer would send it again.
	if err := handoffAcquireScript.Load(testCtx(t), d.dep.rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// Connections already idle are taken out while n are made through p;
	// those go back last, to be taken first.
	var conns []*redis.Conn
	route.Store(&proxied)
	for p.Conns() < n {
		if len(conns) == n+4 {
			t.Fatalf("%d connections through the proxy, want %d", p.Conns(), n)
		}
		c := d.dep.rdb.(*redis.Client).Conn()
		if err := c.Ping(testCtx(t)).Err(); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	route.Store(&direct)
	for _, c := range conns {
		c.Close()
	}
	return d, p
}

// landed heals p and waits until what it held reached the server.
func landed(t *testing.T, p *faultproxy.Proxy) {
	t.Helper()
	up := p.Stats().ForwardedUp
	p.Heal()
	for deadline := time.Now().Add(2 * time.Second); p.Stats().ForwardedUp == up || p.Conns() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the held requests did not reach the server: %+v, %d connections", p.Stats(), p.Conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The clean-up of an Enqueue whose answer was lost (its Leave) frees only
// what that Enqueue's looks took: when it reaches the server late, after
// the claim's next Enqueue (the Client retries under the same token) was
// granted the lock, that grant stays.
func TestLateLeaveSparesNextEnqueue(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	d, p := stallable(t, 2) // the try and its clean-up
	c := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute}
	p.Stall()
	if _, tk, err := d.Enqueue(testCtx(t), c); err == nil || tk != nil {
		t.Fatalf("Enqueue through a stalled proxy: ticket %v, %v", tk, err)
	}
	g, tk, err := d.Enqueue(testCtx(t), c)
	if err != nil || tk != nil {
		t.Fatalf("Enqueue again: ticket %v, %v", tk, err)
	}
	held := lockValue(t, d, c.Key)
	landed(t, p)
	if v := lockValue(t, d, c.Key); v != held {
		t.Fatalf("the first Enqueue's late clean-up changed the second's grant (fence %d): %q, was %q", g.Fence, v, held)
	}
	if err := d.Refresh(testCtx(t), c); err != nil {
		t.Fatalf("refresh of the second grant: %v", err)
	}
}

// A look of a wait that lands late, after a later look of the same token
// took the lock (its answer was lost), does not queue: its entry would be
// handed the lock at the holder's release, and the name would stay held,
// by nobody, for a TTL.
func TestLateLookDoesNotQueue(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	d, p := stallable(t, 1) // the look; its clean-up lands at once
	key := uniqueKey(t)
	other := directDriver(t, false)
	x := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
	if _, err := other.TryAcquire(testCtx(t), x); err != nil {
		t.Fatal(err)
	}
	// A wait that left keeps the key's channel subscribed for a second
	// (linger), so that the next wait's first look joins the queue.
	c := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
	_, tk, err := d.Enqueue(testCtx(t), c)
	if err != nil || tk == nil {
		t.Fatalf("Enqueue behind a holder: ticket %v, %v", tk, err)
	}
	if err := tk.Leave(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if _, tk, err := d.Enqueue(testCtx(t), c); err == nil || tk != nil {
		t.Fatalf("Enqueue through a stalled proxy: ticket %v, %v", tk, err)
	}
	if err := other.Release(testCtx(t), x); err != nil {
		t.Fatal(err)
	}
	if _, tk, err := d.Enqueue(testCtx(t), c); err != nil || tk != nil {
		t.Fatalf("Enqueue of a free lock: ticket %v, %v", tk, err)
	}
	landed(t, p)
	if err := d.Release(testCtx(t), c); err != nil {
		t.Fatal(err)
	}
	if v := lockValue(t, d, key); v != "" {
		t.Fatalf("after the holder's release, the lock holds %q: its late look was handed it", v)
	}
}
