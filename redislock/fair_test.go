package redislock

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func openFair(t *testing.T) *FairDriver {
	t.Helper()
	d, err := OpenFair(testCtx(t), "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		t.Fatalf("OpenFair: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// A queued waiter keeps a free lock from TryAcquire while it is alive; one
// that stopped renewing its liveness is dropped, and then holds nobody up.
func TestFairDeadWaiterIsDropped(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openFair(t)
	rdb := d.Client()
	key := uniqueKey(t)
	// A waiter of a process that died: queued, alive for 300ms more from
	// now, the server's time, which is after queued.
	queued := time.Now()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, keysFor(key).queue, redisZ(now, "dead")).Err(); err != nil {
		t.Fatal(err)
	}
	until := now.Add(300 * time.Millisecond).UnixMilli()
	if err := rdb.HSet(ctx, keysFor(key).live, "dead", strconv.FormatInt(until, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	l := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
	if _, err := d.TryAcquire(ctx, l); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire with a live waiter queued = %v, want ErrNotAcquired", err)
	}
	// A blocking Acquire queues behind it and gets the lock once the dead
	// waiter's liveness ran out, not before.
	start := time.Now()
	g, err := queueAcquire(ctx, d, l)
	if err != nil {
		t.Fatal(err)
	}
	// Not before the dead waiter's liveness ran out, 300ms from the server's
	// time (counted from queued, before it: the requests between may take
	// a loaded machine long); 100ms of that is slack for the two clocks.
	if waited := time.Since(queued); waited < 200*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Errorf("got the lock %v after the dead waiter was queued alive for 300ms (%v after asking)", waited, time.Since(start))
	}
	if g.Fence == 0 || g.Sent.Before(start) {
		t.Errorf("grant %+v", g)
	}
	if n, err := rdb.Exists(ctx, keysFor(key).queue, keysFor(key).live).Result(); err != nil || n != 0 {
		t.Errorf("queue keys left: %d, %v", n, err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

func redisZ(t time.Time, member string) redis.Z {
	return redis.Z{Score: float64(t.UnixMicro()), Member: member}
}

// A release names the next waiter: only that waiter is woken, so the
// others cost the server nothing per hand-off. An empty message (a plain
// driver's release) wakes every waiter.
func TestFairWakesOnlyTheHead(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openFair(t)
	key := uniqueKey(t)
	chs := map[string]chan struct{}{"a": make(chan struct{}, 1), "b": make(chan struct{}, 1), "": make(chan struct{}, 1)}
	for id, ch := range chs {
		_, cancel, err := d.dep.subscribe(ctx, key, id, ch)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
	}
	// woken publishes msg and returns the subscribers it woke: it waits
	// (bounded) for those in want, then 100ms more for any other.
	woken := func(msg string, want ...string) map[string]bool {
		if err := d.Client().Publish(ctx, keysFor(key).channel, msg).Err(); err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		end := time.Now().Add(5 * time.Second)
		for _, id := range want {
			select {
			case <-chs[id]:
				got[id] = true
			case <-time.After(time.Until(end)):
			}
		}
		time.Sleep(100 * time.Millisecond)
		for id, ch := range chs {
			select {
			case <-ch:
				got[id] = true
			default:
			}
		}
		return got
	}
	if got := woken("a", "a", ""); !got["a"] || got["b"] || !got[""] {
		t.Errorf("a message naming a woke %v, want a and the plain subscriber", got)
	}
	if got := woken("", "a", "b", ""); !got["a"] || !got["b"] || !got[""] {
		t.Errorf("an empty message woke %v, want all", got)
	}
}

// Three waiters queued in turn get the lock in that order, and a waiter
// that gives up leaves the queue at once, waking the next one if the lock
// is free.
func TestFairOrderAndLeave(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d1, d2 := openFair(t), openFair(t)
	key := uniqueKey(t)
	holder := backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second}
	if _, err := d1.TryAcquire(ctx, holder); err != nil {
		t.Fatal(err)
	}
	type result struct {
		i   int
		err error
	}
	got := make(chan result, 3)
	cancels := make([]context.CancelFunc, 3)
	locks := make([]backend.Claim, 3)
	for i := range 3 {
		d := []*FairDriver{d1, d2}[i%2]
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		defer cancel()
		locks[i] = backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second}
		go func() {
			_, err := queueAcquire(wctx, d, locks[i])
			got <- result{i, err}
		}()
		waitQueued(t, d1, key, int64(i+1))
	}
	// The first waiter gives up: it leaves, and the queue is 2 long.
	cancels[0]()
	if r := <-got; r.i != 0 || !errors.Is(r.err, backend.ErrNotAcquired) {
		t.Fatalf("cancelled waiter: %d %v", r.i, r.err)
	}
	waitQueued(t, d1, key, 2)
	if err := d1.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	for want := 1; want < 3; want++ {
		select {
		case r := <-got:
			if r.i != want || r.err != nil {
				t.Fatalf("got waiter %d (%v), want waiter %d", r.i, r.err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d not served 5s after the release", want)
		}
		if err := []*FairDriver{d1, d2}[want%2].Release(ctx, locks[want]); err != nil {
			t.Fatal(err)
		}
	}
}

func waitQueued(t *testing.T, d *FairDriver, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := d.Client().ZCard(context.Background(), keysFor(key).queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters queued, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFairURL(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	addr := testenv.RedisAddr()
	drv, _, err := locker.OpenDriver(ctx, "redis://"+addr+"/0?fair=true&dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	if _, ok := drv.(*FairDriver); !ok {
		t.Errorf("fair=true opened a %T, not a *redislock.FairDriver", drv)
	}
	plain, _, err := locker.OpenDriver(ctx, "redis://"+addr+"/0?fair=false")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// Both modes queue waiters; fair=false is the default mode's Driver.
	if _, ok := plain.(*Driver); !ok {
		t.Errorf("fair=false opened a %T, not a *redislock.Driver", plain)
	}
	for _, u := range []string{
		"redis://" + addr + "/0?fair=maybe",
		"redis+quorum://" + addr + "," + addr + "," + addr + "/0?fair=true",
	} {
		if _, err := locker.Open(ctx, u); !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", u, err)
		}
	}
	if _, err := Open(ctx, "redis://"+addr+"/0?fair=true"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("Open with fair=true = %v, want ErrInvalidURL (it is OpenFair's)", err)
	}
}
