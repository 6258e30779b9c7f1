package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// The lock value is "<token>.<attempt>:<fence>:<owner>", written by the
// acquire script; an owner with ':' and spaces comes back whole, and the
// token never shows in a State.
func TestValueRecordsFenceAndOwner(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	admin := adminClient(t, testenv.RedisAddr())
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second, Owner: "job: a:b c"}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release(ctx, l)
	v, err := admin.Get(ctx, keysFor(l.Key).lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := ":" + strconv.FormatUint(g.Fence, 10) + ":job: a:b c"; !strings.HasPrefix(v, l.Token+".") || !strings.HasSuffix(v, want) {
		t.Errorf("lock value %q, want %q<attempt>%q", v, l.Token+".", want)
	}
	st, err := d.Inspect(ctx, l.Key, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Owner != l.Owner || st.Fence != g.Fence || st.TTL <= 4*time.Second || st.TTL > 5*time.Second || st.Known != fairKnows {
		t.Errorf("Inspect = %+v", st)
	}
	if strings.Contains(st.Owner+st.Key, l.Token) {
		t.Errorf("Inspect shows the token: %+v", st)
	}
	// A retry of the same attempt reports the fence recorded in the value.
	k := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second}
	value := attempt(k)
	f1, err := d.acquire(ctx, k, value, 5000)
	if err != nil || f1 <= 0 {
		t.Fatal(f1, err)
	}
	defer d.Release(ctx, k)
	if f2, err := d.acquire(ctx, k, value, 5000); err != nil || f2 != f1 {
		t.Errorf("retried attempt: fence %d, %v; want %d", f2, err, f1)
	}
}

// List on a ring scans every shard and returns the original keys.
func TestListRing(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs[0], addrs[1])
	t.Parallel()
	ctx := testCtx(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0], "b": addrs[1]}})
	defer ring.Close()
	d := mustNew(t, ring)
	defer d.Close()
	prefix := uniqueKey(t) + "/"
	var want []string
	for i := range 12 {
		key := prefix + string(rune('a'+i)) + " ü"
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: newToken(), TTL: 10 * time.Second, Owner: "o"}); err != nil {
			t.Fatal(err)
		}
		want = append(want, key)
	}
	got, err := d.List(ctx, prefix, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, st := range got {
		keys = append(keys, st.Key)
		if !st.Held || st.Owner != "o" || st.Fence == 0 {
			t.Errorf("List: %+v", st)
		}
		d.Break(ctx, st.Key, backend.Exclusive, st.Fence)
	}
	if slices.Sort(keys); !slices.Equal(keys, want) {
		t.Errorf("List = %q, want %q", keys, want)
	}
}

// A Quorum with a member that refuses connections: Inspect, List and
// Break decide by the two that answer when those agree, and refuse to
// guess when the silent one could decide.
func TestQuorumInspectWithSilentMember(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs[0], addrs[1])
	t.Parallel()
	ctx := testCtx(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	var clients []redis.UniversalClient
	for _, a := range []string{addrs[0], addrs[1], closed} {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialerRetries: 1})
		defer c.Close()
		clients = append(clients, c)
	}
	q, err := NewQuorum(clients)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second, Owner: "q"}
	g, err := q.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	st, err := q.Inspect(ctx, l.Key, backend.Exclusive)
	if err != nil || !st.Held || st.Fence != g.Fence || st.Owner != "q" || st.TTL <= 0 || st.TTL > 6*time.Second {
		t.Fatalf("Inspect = %+v, %v; want held under fence %d", st, err, g.Fence)
	}
	if got, err := q.List(ctx, l.Key, backend.Exclusive); err != nil || len(got) != 1 || got[0].Fence != g.Fence {
		t.Fatalf("List = %+v, %v", got, err)
	}
	// On one of the two that answer, the lock is gone: the silent one
	// could hold it or not, so neither answer is given.
	admin := adminClient(t, addrs[1])
	if err := admin.Del(ctx, keysFor(l.Key).lock).Err(); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Inspect(ctx, l.Key, backend.Exclusive); err == nil || !strings.Contains(err.Error(), closed) {
		t.Errorf("Inspect with the lock on 1 of 2 answering servers = %+v, %v; want an error naming %s", st, err, closed)
	}
	if got, err := q.List(ctx, l.Key, backend.Exclusive); err == nil {
		t.Errorf("List with the lock on 1 of 2 answering servers = %+v, want an error", got)
	}
	if _, err := q.Break(ctx, l.Key, backend.Exclusive, g.Fence); err == nil || errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Break removing it from 1 of 3 servers = %v, want an error that is not ErrNotHeld", err)
	}
	if st, err := q.Inspect(ctx, l.Key, backend.Exclusive); err != nil || st.Held {
		t.Errorf("Inspect after the Break = %+v, %v; want free", st, err)
	}
	if err := q.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("the removed holder's Refresh = %v, want ErrNotHeld", err)
	}
}

// A semaphore's queued waiter shows in Inspect with its owner; Break of
// the holder publishes the release, as the holder's own would, and the
// waiter gets the permit under a higher fence.
func TestSharedInspectQueueAndBreakWakes(t *testing.T) {
	d, admin := modalDriver(t)
	t.Parallel()
	ctx := testCtx(t)
	key := uniqueKey(t)
	sem := func(owner string) backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 1, Owner: owner}
	}
	a, b := sem("a"), sem("waiter b: x")
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	got := queueInBackground(t, ctx, d, d, b)
	st, err := d.Inspect(ctx, key, backend.Permit)
	if err != nil {
		t.Fatal(err)
	}
	want := backend.Holder{Mode: backend.Permit, Owner: a.Owner, Fence: g.Fence, Weight: 1}
	if len(st.Holders) != 1 || st.Holders[0].TTL <= 0 || st.Holders[0].TTL > time.Minute || !slices.Equal(st.Queue, []string{b.Owner}) || st.Limit != 1 {
		t.Fatalf("Inspect = %+v, want the holder %+v and the waiter %q", st, want, b.Owner)
	}
	if st.Holders[0].TTL = 0; st.Holders[0] != want {
		t.Errorf("Inspect's holder = %+v, want %+v", st.Holders[0], want)
	}
	sub := admin.Subscribe(ctx, keysFor(key).channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	if _, err := d.Break(ctx, key, backend.Permit, g.Fence); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := sub.ReceiveMessage(rctx); err != nil {
		t.Fatalf("no release published by Break within 5s: %v", err)
	}
	if err := d.Refresh(ctx, a); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("the removed holder's Refresh = %v, want ErrNotHeld", err)
	}
	r := <-got
	if r.err != nil || r.g.Fence <= g.Fence {
		t.Fatalf("the waiter after Break: %+v, %v; want a fence above %d", r.g, r.err, g.Fence)
	}
	if err := d.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// List of semaphores and read-write locks on a Redis Cluster reads every
// master, each page in a pipeline; after SCRIPT FLUSH (a failover, a
// restart) the pipeline's scripts that come back NOSCRIPT are sent whole.
func TestListSharedCluster(t *testing.T) {
	d, admin := clusterDriver(t)
	ctx := testCtx(t)
	prefix := uniqueKey(t) + "/"
	var want []string
	nodes := map[string]bool{}
	for i := range 12 {
		key := prefix + string(rune('a'+i)) + " ü"
		for _, c := range []backend.Claim{
			{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 3, Weight: 2},
			{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Read},
		} {
			if _, err := d.TryAcquire(ctx, c); err != nil {
				t.Fatal(err)
			}
			defer d.Release(ctx, c)
		}
		n, err := admin.MasterForKey(ctx, sharedPrefix(backend.Claim{Key: key, Mode: backend.Permit}))
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.String()] = true
		want = append(want, key)
	}
	if len(nodes) < 2 {
		t.Fatalf("the objects are on %d master(s), want more than one", len(nodes))
	}
	for _, flush := range []bool{false, true} {
		if flush {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range []backend.Mode{backend.Permit, backend.Read} {
			got, err := d.List(ctx, prefix, m)
			if err != nil {
				t.Fatalf("List(%s) after a flush %v: %v", m, flush, err)
			}
			var keys []string
			for _, st := range got {
				keys = append(keys, st.Key)
				w := map[backend.Mode]int{backend.Permit: 2, backend.Read: 1}[m]
				if !st.Held || st.Mode != m || len(st.Holders) != 1 || st.Holders[0].Mode != m || st.Holders[0].Weight != w || (m == backend.Permit) != (st.Limit == 3) {
					t.Errorf("List(%s): %+v", m, st)
				}
			}
			if slices.Sort(keys); !slices.Equal(keys, want) {
				t.Errorf("List(%s) = %q, want %q", m, keys, want)
			}
		}
	}
	if got, err := d.List(ctx, prefix, backend.Exclusive); err != nil || len(got) != 0 {
		t.Errorf("List of locks = %+v, %v; want none", got, err)
	}
}
