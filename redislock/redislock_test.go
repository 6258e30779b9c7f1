package redislock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var randHex = testutil.RandHex

// uniqueKey returns a driver key no other test uses.
func uniqueKey(t *testing.T) string {
	return backend.Key("redislock-test", t.Name()+"/"+randHex(4))
}

var newToken = testutil.Token

func adminClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func openDriver(t *testing.T, opts ...Option) *Driver {
	t.Helper()
	d, err := Open(testCtx(t), "redis://"+testenv.RedisAddr()+"/0", opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// mustNew is New, failing tb on an error; the caller closes the Driver.
func mustNew(tb testing.TB, rdb redis.UniversalClient, opts ...Option) *Driver {
	tb.Helper()
	d, err := New(rdb, opts...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return d
}

// clusterDriver opens a Driver on the Redis Cluster, and an admin client
// of it; both close when t ends.
func clusterDriver(t *testing.T) (*Driver, *redis.ClusterClient) {
	addrs := testenv.RedisClusterAddrs()
	testenv.Require(t, addrs...)
	d, err := Open(testCtx(t), "redis+cluster://"+strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { admin.Close() })
	return d, admin
}

// mustNewFair is NewFair, failing tb on an error; the caller closes the
// FairDriver.
func mustNewFair(tb testing.TB, rdb redis.UniversalClient, opts ...Option) *FairDriver {
	tb.Helper()
	d, err := NewFair(rdb, opts...)
	if err != nil {
		tb.Fatalf("NewFair: %v", err)
	}
	return d
}

// queueAcquire acquires c in q's queue as the locker Client does, but
// without its retries: it enqueues and waits, and leaves the queue when it
// stops without the lock; cancelled, it returns ErrNotAcquired and why.
func queueAcquire(ctx context.Context, q backend.Queuer, c backend.Claim) (backend.Grant, error) {
	g, t, err := q.Enqueue(ctx, c)
	for t != nil && (err == nil || errors.Is(err, backend.ErrNotAcquired)) {
		if g, err = t.Wait(ctx); err == nil {
			return g, nil
		}
	}
	if t != nil && !errors.Is(err, backend.ErrRequeue) {
		t.Leave(context.WithoutCancel(ctx))
	}
	if err != nil && ctx.Err() != nil {
		return g, fmt.Errorf("%w: %w", backend.ErrNotAcquired, context.Cause(ctx))
	}
	return g, err
}

// queuedResult is a background queueAcquire's answer.
type queuedResult struct {
	g   backend.Grant
	err error
}

// queueInBackground runs queueAcquire of c on q in a goroutine, and waits,
// for at most 5s, until d's Inspect of c's object shows a waiter queued.
func queueInBackground(t *testing.T, ctx context.Context, d *Driver, q backend.Queuer, c backend.Claim) <-chan queuedResult {
	t.Helper()
	got := make(chan queuedResult, 1)
	go func() {
		g, err := queueAcquire(ctx, q, c)
		got <- queuedResult{g, err}
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := d.Inspect(ctx, c.Key, c.Mode)
		if err != nil {
			t.Fatal(err)
		}
		if st.Waiters > 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("Inspect = %+v 5s after a waiter began to wait, want it queued", st)
		}
	}
}

func TestKeysShareASlot(t *testing.T) {
	for _, k := range []string{"ns/a", "ns/{x}", "ns/}{", "ns/a:b", "ns/ü/../"} {
		ks := keysFor(k)
		lk, fk, ch := ks.lock, ks.fence, ks.channel
		tag := func(s string) string {
			i := strings.IndexByte(s, '{')
			j := strings.IndexByte(s[i+1:], '}')
			return s[i+1 : i+1+j]
		}
		if tag(lk) != backend.EscapeKey(k) || tag(fk) != tag(lk) || tag(ch) != tag(lk) {
			t.Errorf("key %q: lock %q, fence %q, channel %q do not share the hash tag %q", k, lk, fk, ch, backend.EscapeKey(k))
		}
	}
}

func TestTTLRounding(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	admin := adminClient(t, testenv.RedisAddr())
	for _, c := range []struct {
		ttl, want time.Duration
	}{
		{time.Nanosecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{time.Second, time.Second},
		{30 * 24 * time.Hour, 30 * 24 * time.Hour},
	} {
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: c.ttl}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatalf("TryAcquire(TTL %v): %v", c.ttl, err)
		}
		if g.TTL != c.want {
			t.Errorf("TTL %v granted as %v, want %v", c.ttl, g.TTL, c.want)
		}
		if c.ttl >= time.Second {
			pttl, err := admin.PTTL(ctx, keysFor(l.Key).lock).Result()
			if err != nil || pttl <= 0 || pttl > c.want {
				t.Errorf("TTL %v: the server's PTTL is %v (err %v)", c.ttl, pttl, err)
			}
		}
		_ = d.Release(ctx, l)
	}
}

// The acquire script is safe to run twice (go-redis retries a command whose
// reply was lost): the second run of one attempt reports the same grant. A
// new attempt of the same token (the caller retrying after an error) takes
// the key over with a new fence; cleaning up after the first attempt then
// leaves the second's key alone.
func TestAcquireRetryIsIdempotent(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second}
	first := attempt(l)
	f1, err := d.acquire(ctx, l, first, 5000)
	if err != nil || f1 == 0 {
		t.Fatal(f1, err)
	}
	again, err := d.acquire(ctx, l, first, 5000)
	if err != nil || again != f1 {
		t.Fatalf("the same attempt run twice = %d, %v; want fence %d", again, err, f1)
	}
	g2, err := d.TryAcquire(ctx, l)
	if err != nil || g2.Fence <= uint64(f1) {
		t.Fatalf("a new attempt of the same token = %+v, %v; want a fence above %d", g2, err, f1)
	}
	d.dep.cleanup(ctx, l, first)
	other := l
	other.Token = newToken()
	if _, err := d.TryAcquire(ctx, other); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("another token's acquire = %v, want ErrNotAcquired: the first attempt's cleanup removed the second's key", err)
	}
	if err := d.Refresh(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// Losing the fence counter (as a restart without persistence would), or
// going back to a stale one (as a failover to a replica that missed
// increments would, seconds later), does not make fences go back.
func TestFenceSurvivesLostCounter(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	admin := adminClient(t, testenv.RedisAddr())
	key := uniqueKey(t)
	var last uint64
	for i := range 6 {
		l := backend.Claim{Key: key, Token: newToken(), TTL: time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("round %d: fence %d after %d", i, g.Fence, last)
		}
		last = g.Fence
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 1:
			admin.Del(ctx, keysFor(key).fence) // lost
		case 3:
			// stale: a replica that missed increments, promoted later
			admin.Set(ctx, keysFor(key).fence, "7", 0)
		}
	}
	if err := admin.Del(ctx, keysFor(key).fence).Err(); err != nil {
		t.Fatal(err)
	}
}

// A name's fence counter expires the retention after the name's last
// grant, in every mode, and the fences after it are still higher.
func TestFenceCounterRetention(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	const retention = 300 * time.Millisecond
	admin := adminClient(t, testenv.RedisAddr())
	plain := openDriver(t, WithRetention(retention))
	fair, err := OpenFair(ctx, "redis://"+testenv.RedisAddr()+"/0?retention=300ms")
	if err != nil {
		t.Fatal(err)
	}
	defer fair.Close()
	for _, d := range []backend.Driver{plain, fair} {
		key := uniqueKey(t)
		var last uint64
		for round := range 2 {
			l := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				t.Fatal(err)
			}
			if g.Fence <= last {
				t.Fatalf("%T round %d: fence %d after %d", d, round, g.Fence, last)
			}
			last = g.Fence
			if pttl := admin.PTTL(ctx, keysFor(key).fence).Val(); pttl <= 0 || pttl > retention {
				t.Fatalf("%T: the fence counter's PTTL is %v, want in (0, %v]", d, pttl, retention)
			}
			if err := d.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			time.Sleep(retention + 100*time.Millisecond)
			if n := admin.Exists(ctx, keysFor(key).lock, keysFor(key).fence, keysFor(key).queue, keysFor(key).live).Val(); n != 0 {
				t.Fatalf("%T: %d keys of the name remain %v after its release", d, n, retention+100*time.Millisecond)
			}
		}
	}
}

// An empty script cache (restart, failover, SCRIPT FLUSH) is refilled.
func TestNoScriptFallback(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := testCtx(t)
	d := openDriver(t)
	admin := adminClient(t, testenv.RedisAddr())
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Second}
	for _, step := range []func() error{
		func() error { _, err := d.TryAcquire(ctx, l); return err },
		func() error { return d.Refresh(ctx, l) },
		func() error { return d.Release(ctx, l) },
	} {
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := step(); err != nil {
			t.Fatalf("after SCRIPT FLUSH: %v", err)
		}
	}
}

func TestNotifications(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d1, d2 := openDriver(t), openDriver(t, withLinger(20*time.Millisecond))
	key := uniqueKey(t)
	l := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
	if _, err := d1.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	ch, cancel, err := d2.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	ch2, cancel2, err := d2.Subscribe(ctx, key) // a second waiter on the same name
	if err != nil {
		t.Fatal(err)
	}
	other, cancelOther, err := d2.Subscribe(ctx, key+"x")
	if err != nil {
		t.Fatal(err)
	}
	defer cancelOther()
	if err := d1.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	for i, c := range []<-chan struct{}{ch, ch2} {
		select {
		case <-c:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d: no notification 5s after the release", i)
		}
	}
	select {
	case <-other:
		t.Fatalf("a release of another name woke a waiter")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	cancel() // idempotent
	cancel2()
	// The channel is unsubscribed after the linger; the hub stays for the
	// other name.
	deadline := time.Now().Add(5 * time.Second)
	for {
		d2.dep.mu.Lock()
		h := d2.dep.hubs[""]
		n := len(h.chans)
		d2.dep.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channels still subscribed, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancelOther()
	for {
		d2.dep.mu.Lock()
		n := len(d2.dep.hubs)
		d2.dep.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle hub was not closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And it comes back.
	ch, cancel, err = d2.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if _, err := d1.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d1.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("no notification after re-subscribing")
	}
	d2.Close()
	if _, _, err := d2.Subscribe(ctx, key); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}
	cancel() // after Close: still safe
}

// Many waiters subscribe and leave concurrently, on several names, while
// releases are published: no race, no lost confirmation.
func TestSubscribeChurn(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t, withLinger(time.Millisecond))
	pub := openDriver(t)
	keys := []string{uniqueKey(t), uniqueKey(t), uniqueKey(t)}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 30 {
				key := keys[(w+i)%len(keys)]
				_, cancel, err := d.Subscribe(ctx, key)
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				l := backend.Claim{Key: key, Token: newToken(), TTL: time.Second}
				if _, err := pub.TryAcquire(ctx, l); err == nil {
					_ = pub.Release(ctx, l)
				}
				cancel()
			}
		})
	}
	wg.Wait()
}

func TestMaxmemoryWarning(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := testCtx(t)
	admin := adminClient(t, testenv.RedisAddr())
	old, err := admin.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		t.Skipf("CONFIG GET: %v", err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Skipf("CONFIG SET: %v", err)
	}
	t.Cleanup(func() { admin.ConfigSet(context.Background(), "maxmemory-policy", old["maxmemory-policy"]) })

	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	d, err := Open(ctx, "redis://"+testenv.RedisAddr()+"/0", WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if !strings.Contains(buf.String(), "allkeys-lru") {
		t.Fatalf("Open logged %q, want a warning naming allkeys-lru", buf.String())
	}

	// New checks in the background.
	buf.Reset()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	d = mustNew(t, rdb, WithLogger(log))
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "allkeys-lru") {
		if time.Now().After(deadline) {
			t.Fatalf("New logged %q, want a warning naming allkeys-lru", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}

	// A user who may not run CONFIG: no warning, no failure.
	user := "redislock-test-" + randHex(4)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Skipf("ACL SETUSER: %v", err)
	}
	defer admin.Do(context.Background(), "ACL", "DELUSER", user)
	buf.Reset()
	d, err = Open(ctx, "redis://"+user+":pw@"+testenv.RedisAddr()+"/0", WithLogger(log))
	if err != nil {
		t.Fatalf("Open as a user without CONFIG: %v", err)
	}
	defer d.Close()
	if strings.Contains(buf.String(), "WARN") {
		t.Fatalf("warned without being able to read the policy: %q", buf.String())
	}
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatalf("TryAcquire as a user without CONFIG: %v", err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

type syncBuffer = testutil.SyncBuffer

// A ring spreads names over shards; each name's lock, fence and release
// channel stay on one shard, and waiters are woken on that shard.
func TestRing(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs[0], addrs[1])
	t.Parallel()
	ctx := testCtx(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0], "b": addrs[1]}})
	defer ring.Close()
	rdb1 := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0], "b": addrs[1]}})
	defer rdb1.Close()
	c1, err := locker.New(mustNew(t, ring), locker.WithNamespace("redislock-ring"))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := locker.New(mustNew(t, rdb1), locker.WithNamespace("redislock-ring"))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for i := range 8 {
		name := t.Name() + randHex(4) + string(rune('a'+i))
		l, err := c1.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := c2.Acquire(ctx, name)
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(30 * time.Millisecond)
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		// Woken, not polled: well under the 250ms backoff cap.
		if d := time.Since(released); d > 200*time.Millisecond {
			t.Logf("name %d: waiter took %v after the release", i, d)
		}
	}
}

// Close leaves the caller's client open, and stops every goroutine.
func TestNewDoesNotCloseCallersClient(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	d := mustNew(t, rdb)
	if _, cancel, err := d.Subscribe(ctx, uniqueKey(t)); err != nil {
		t.Fatal(err)
	} else {
		defer cancel()
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, l); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("the caller's client was closed: %v", err)
	}
}
