package redislock

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A set on one server is one script: every name or none, each with its
// own fence; the release is one script.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	d := openDriver(t)
	ctx := testCtx(t)
	ns := "set-" + newToken()[:8]
	set := func(names ...string) []backend.Claim {
		cs := make([]backend.Claim, len(names))
		for i, n := range names {
			cs[i] = backend.Claim{Key: ns + "/" + n, Token: newToken(), TTL: time.Minute, Owner: "set"}
		}
		return cs
	}
	cs := set("a", "b", "c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("TryAcquireAll of free names: %v %v", gs, err)
	}
	for i, g := range gs {
		if g.Fence == 0 || g.TTL != time.Minute {
			t.Fatalf("grant %d: %+v", i, g)
		}
		cs[i].Fence = g.Fence
	}
	other := set("c", "d")
	if _, err := d.TryAcquireAll(ctx, other); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held name: %v, want ErrNotAcquired", err)
	}
	if st, err := d.Inspect(ctx, other[1].Key, backend.Exclusive); err != nil || st.Held {
		t.Fatalf("%s after the refused set: %+v %v, want free", other[1].Key, st, err)
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("second ReleaseAll %s: %v, want ErrNotHeld", cs[i].Key, err)
		}
	}
	again := set("a", "b", "c")
	gs2, err := d.TryAcquireAll(ctx, again)
	if err != nil || gs2[0].Fence <= gs[0].Fence {
		t.Fatalf("TryAcquireAll after the release: %v %v, want fences above the first set's", gs2, err)
	}
	for i := range again {
		again[i].Fence = gs2[i].Fence
	}
	for _, err := range d.ReleaseAll(ctx, again) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The fair mode takes sets name by name.
	fair, err := OpenFair(ctx, "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer fair.Close()
	if _, err := fair.TryAcquireAll(ctx, set("x", "y")); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("fair TryAcquireAll: %v, want ErrUnsupported", err)
	}
}

// A set's release leaves a name with a waiter to its own release script,
// which hands the lock to the waiter: woken at once, not by its polling;
// the other names are freed by the set's one script.
func TestReleaseAllHandsOff(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	ns := "set-" + newToken()[:8]
	open := func(opts ...locker.Option) *locker.Client {
		c, err := locker.New(openDriver(t), append(opts, locker.WithNamespace(ns))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := open()
	// Polls at least a second apart: a waiter that gets the lock sooner
	// was handed it.
	waiter := open(locker.WithBackoff(time.Second, time.Second))
	set, err := holder.TryAcquireAll(ctx, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "a")
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		l.Release(ctx)
	}()
	live := keysFor(backend.Key(ns, "a")).live
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	for i := 0; ; i++ { // the waiter is queued
		if n, err := rdb.Exists(ctx, live).Result(); err == nil && n == 1 {
			break
		}
		if i == 100 {
			t.Fatal("the waiter did not queue within 5s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	released := time.Now()
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if at := <-got; at.IsZero() || at.Sub(released) > 500*time.Millisecond {
		t.Fatalf("the waiter got a %v after the set's release, want at once (handed off)", at.Sub(released))
	}
	l, err := holder.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatalf("b after the set's release: %v", err)
	}
	l.Release(ctx)
}
