package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// batchCase is one lock of a mixed batch and what RefreshMany must say.
type batchCase struct {
	what string
	l    backend.Claim
	held bool // RefreshMany returns nil and extends it; else ErrNotHeld
}

// mixedBatch prepares, on drv, a batch of locks in every state: held,
// released, taken by another token, expired (its key expired on every
// server), never acquired. admins reach every server; foreign records the
// other token's lock, whose expiry RefreshMany must not touch.
func mixedBatch(t *testing.T, drv backend.Driver, admins []redis.Cmdable, held int) (cases []batchCase, foreign backend.Claim) {
	t.Helper()
	ctx := testCtx(t)
	lock := func() backend.Claim {
		return backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 2 * time.Second}
	}
	acquire := func(l backend.Claim) {
		t.Helper()
		if _, err := drv.TryAcquire(ctx, l); err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		spread(t, admins, l.Key)
	}
	addHeld := func() {
		l := lock()
		acquire(l)
		cases = append(cases, batchCase{"held", l, true})
	}
	addHeld()
	released := lock()
	acquire(released)
	if err := drv.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, batchCase{"released", released, false})
	addHeld()
	taken := lock()
	acquire(taken)
	if err := drv.Release(ctx, taken); err != nil {
		t.Fatal(err)
	}
	foreign = backend.Claim{Key: taken.Key, Token: newToken(), TTL: 2 * time.Second}
	acquire(foreign)
	waitKey(t, admins, foreign.Key, true)
	cases = append(cases, batchCase{"taken by another token", taken, false})
	expired := lock()
	acquire(expired)
	// A quorum's TryAcquire returns once a majority granted: wait for the
	// other grants before expiring the key everywhere. Their keys are not
	// enough (spread may have made one before its grant came): a grant
	// that lands after the expiry below takes the key again.
	waitKey(t, admins, expired.Key, true)
	stragglers(t, drv, expired.Token)
	for _, a := range admins {
		if err := a.PExpire(ctx, keysFor(expired.Key).lock, time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitKey(t, admins, expired.Key, false)
	cases = append(cases, batchCase{"expired", expired, false})
	cases = append(cases, batchCase{"never acquired", lock(), false})
	for range held - 2 {
		addHeld()
	}
	for _, c := range cases {
		if c.held {
			waitKey(t, admins, c.l.Key, true)
		}
	}
	return cases, foreign
}

// spread makes key's lock key, as a server that granted it has it, exist
// on every server: a quorum's TryAcquire returns once a majority granted,
// and a server whose vote was lost (a slow first dial on a loaded machine,
// which a quorum does not retry) never gets it. The batch tests need every
// server alike.
func spread(t *testing.T, admins []redis.Cmdable, key string) {
	t.Helper()
	if len(admins) < 2 {
		return
	}
	ctx := testCtx(t)
	var value string
	var ttl time.Duration
	deadline := time.Now().Add(2 * time.Second)
	for value == "" {
		for _, a := range admins {
			v, err := a.Get(ctx, keysFor(key).lock).Result()
			if err == nil {
				value, ttl = v, a.PTTL(ctx, keysFor(key).lock).Val()
				break
			}
		}
		if value == "" {
			if time.Now().After(deadline) {
				t.Fatalf("no server has %s", keysFor(key).lock)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, a := range admins {
		if err := a.SetNX(ctx, keysFor(key).lock, value, max(ttl, time.Millisecond)).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// stragglers waits, bounded, until every server of a Quorum drv has
// answered the acquisition of token.
func stragglers(t *testing.T, drv backend.Driver, token string) {
	t.Helper()
	q, ok := drv.(*Quorum)
	if !ok {
		return
	}
	q.mu.Lock()
	st := q.inflight[token]
	q.mu.Unlock()
	if st == nil {
		return
	}
	select {
	case <-st.settled:
	case <-time.After(5 * time.Second):
		t.Fatal("a server's answer to the acquisition did not come within 5s")
	}
}

// waitKey waits, bounded, until key's lock key exists (or not) on every
// server.
func waitKey(t *testing.T, admins []redis.Cmdable, key string, exists bool) {
	t.Helper()
	ctx := testCtx(t)
	want := int64(0)
	if exists {
		want = 1
	}
	for i, a := range admins {
		deadline := time.Now().Add(2 * time.Second)
		for {
			n, err := a.Exists(ctx, keysFor(key).lock).Result()
			if err == nil && n == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %d: EXISTS %s = %d (%v), want %d", i+1, keysFor(key).lock, n, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// checkMixed runs RefreshMany over cases with a 10 s TTL and checks each
// lock's error and, on every server, its expiry.
func checkMixed(t *testing.T, br backend.BatchRefresher, admins []redis.Cmdable, cases []batchCase, foreign backend.Claim) {
	t.Helper()
	ctx := testCtx(t)
	locks := make([]backend.Claim, len(cases))
	for i, c := range cases {
		locks[i] = c.l
		locks[i].TTL = 10 * time.Second
	}
	errs := br.RefreshMany(ctx, locks)
	if len(errs) != len(cases) {
		t.Fatalf("RefreshMany returned %d errors for %d locks", len(errs), len(cases))
	}
	for i, c := range cases {
		switch {
		case c.held && errs[i] != nil:
			t.Errorf("lock %d (%s): %v, want nil", i, c.what, errs[i])
		case !c.held && !errors.Is(errs[i], backend.ErrNotHeld):
			t.Errorf("lock %d (%s): %v, want ErrNotHeld", i, c.what, errs[i])
		}
	}
	// Each held lock now lives about 10 s on every server (a quorum's
	// slower servers may still be answering: wait for them); the other
	// token's lock still has its own 2 s.
	for i, c := range cases {
		if !c.held {
			continue
		}
		for j, a := range admins {
			deadline := time.Now().Add(2 * time.Second)
			for {
				pttl, err := a.PTTL(ctx, keysFor(c.l.Key).lock).Result()
				if err == nil && pttl > 9*time.Second && pttl <= 10200*time.Millisecond {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("lock %d (%s), server %d: PTTL %v (%v), want about 10s", i, c.what, j+1, pttl, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	for j, a := range admins {
		if pttl, err := a.PTTL(ctx, keysFor(foreign.Key).lock).Result(); err != nil || pttl <= 0 || pttl > 2100*time.Millisecond {
			t.Errorf("server %d: the other token's lock has PTTL %v (%v), want at most its own 2s", j+1, pttl, err)
		}
	}
}

func TestRefreshManySingle(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	d := openDriver(t)
	admins := []redis.Cmdable{adminClient(t, testenv.RedisAddr())}
	cases, foreign := mixedBatch(t, d, admins, 4)
	checkMixed(t, d, admins, cases, foreign)
}

func TestRefreshManyFair(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	d, err := OpenFair(testCtx(t), "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	admins := []redis.Cmdable{adminClient(t, testenv.RedisAddr())}
	cases, foreign := mixedBatch(t, d, admins, 4)
	checkMixed(t, d, admins, cases, foreign)
}

// On a Redis Cluster the locks' keys fall in slots on different nodes;
// go-redis splits the pipeline by node.
func TestRefreshManyCluster(t *testing.T) {
	d, admin := clusterDriver(t)
	ctx := testCtx(t)
	cases, foreign := mixedBatch(t, d, []redis.Cmdable{admin}, 30)
	// The held locks live on more than one node.
	nodes := map[string]bool{}
	for _, c := range cases {
		if c.held {
			n, err := admin.MasterForKey(ctx, keysFor(c.l.Key).lock)
			if err != nil {
				t.Fatal(err)
			}
			nodes[n.Options().Addr] = true
		}
	}
	if len(nodes) < 2 {
		t.Fatalf("the held locks are on %d node(s), want several", len(nodes))
	}
	checkMixed(t, d, []redis.Cmdable{admin}, cases, foreign)
}

func quorumAdmins(t *testing.T, addrs []string) []redis.Cmdable {
	var admins []redis.Cmdable
	for _, a := range addrs {
		admins = append(admins, adminClient(t, a))
	}
	return admins
}

func TestRefreshManyQuorum(t *testing.T) {
	_, addrs := privateQuorum(t)
	q, err := OpenQuorum(testCtx(t), "redis+quorum://"+strings.Join(addrs, ",")+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	admins := quorumAdmins(t, addrs)
	cases, foreign := mixedBatch(t, q, admins, 4)
	checkMixed(t, q, admins, cases, foreign)

	// Per lock, the majority rule of Refresh: a lock held on five, three
	// and two of five servers (set there directly) holds, holds, is lost.
	ctx := testCtx(t)
	var locks []backend.Claim
	for i, on := range []int{5, 3, 2} {
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 2 * time.Second}
		for _, a := range admins[5-on:] {
			if err := a.Set(ctx, keysFor(l.Key).lock, l.Token+"."+strconv.Itoa(i), 2*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
		}
		locks = append(locks, l)
	}
	errs := q.RefreshMany(ctx, locks)
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], backend.ErrNotHeld) {
		t.Fatalf("held by 5, 3 and 2 of 5: %v, want nil, nil, ErrNotHeld", errs)
	}
	// The same verdicts as Refresh, one by one.
	for i, l := range locks {
		if err := q.Refresh(ctx, l); (err == nil) != (errs[i] == nil) || errors.Is(err, backend.ErrNotHeld) != errors.Is(errs[i], backend.ErrNotHeld) {
			t.Errorf("lock %d: Refresh = %v, RefreshMany = %v", i, err, errs[i])
		}
	}
}

// A quorum whose members sit behind fault proxies: with a minority
// blackholed RefreshMany succeeds without waiting for it; with a majority
// blackholed it fails with an error that is not ErrNotHeld (it cannot
// tell), when its context ends.
func TestRefreshManyQuorumFaults(t *testing.T) {
	_, addrs := privateQuorum(t)
	ctx := testCtx(t)
	var proxies []*faultproxy.Proxy
	var clients []redis.UniversalClient
	for _, a := range addrs {
		p, err := faultproxy.New(a)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		proxies = append(proxies, p)
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		defer c.Close()
		clients = append(clients, c)
	}
	q, err := NewQuorum(clients)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	admins := quorumAdmins(t, addrs)
	var locks []backend.Claim
	for range 20 {
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second}
		if _, err := q.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	for _, l := range locks {
		waitKey(t, admins, l.Key, true)
	}

	proxies[0].Blackhole()
	proxies[3].Blackhole()
	start := time.Now()
	for i, err := range q.RefreshMany(ctx, locks) {
		if err != nil {
			t.Fatalf("lock %d with 2 of 5 servers blackholed: %v", i, err)
		}
	}
	took := time.Since(start)
	t.Logf("2 of 5 blackholed: RefreshMany of %d locks took %v", len(locks), took.Round(time.Millisecond))
	if took > 500*time.Millisecond {
		t.Errorf("RefreshMany waited %v for the blackholed minority", took)
	}

	proxies[1].Blackhole()
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	errs := q.RefreshMany(rctx, locks)
	took = time.Since(start)
	t.Logf("3 of 5 blackholed: RefreshMany of %d locks took %v: %v", len(locks), took.Round(time.Millisecond), errs[0])
	for i, err := range errs {
		if err == nil || errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("lock %d with 3 of 5 servers blackholed: %v, want an error other than ErrNotHeld", i, err)
		}
	}
	if took > 300*time.Millisecond+200*time.Millisecond {
		t.Errorf("RefreshMany returned %v after it began, its context ended at 300ms", took)
	}
	for _, p := range proxies {
		p.Heal()
	}
	// Healed, the locks are still held.
	for i, err := range q.RefreshMany(ctx, locks) {
		if err != nil {
			t.Errorf("lock %d after healing: %v", i, err)
		}
	}
	for _, l := range locks {
		q.Release(ctx, l)
	}
}

// An emptied script cache (SCRIPT FLUSH on a private server) is refilled:
// the entries that got NOSCRIPT go again as EVAL.
func TestRefreshManyNoScript(t *testing.T) {
	s := testenv.StartRedis(t)
	ctx := testCtx(t)
	cc := &callCounter{}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	rdb.AddHook(cc)
	d := mustNew(t, rdb)
	defer d.Close()
	q, err := NewQuorum([]redis.UniversalClient{rdb})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	admins := []redis.Cmdable{adminClient(t, s.Addr)}
	for _, br := range []interface {
		backend.Driver
		backend.BatchRefresher
	}{d, q} {
		cases, foreign := mixedBatch(t, br, admins, 5)
		if err := admins[0].ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		calls := cc.calls.Load()
		checkMixed(t, br, admins, cases, foreign)
		// One pipeline of EVALSHA, all NOSCRIPT, then one of EVAL.
		if n := cc.calls.Load() - calls; n != 2 {
			t.Errorf("%T: %d round trips after SCRIPT FLUSH, want 2", br, n)
		}
		// The cache is full again: one round trip.
		calls = cc.calls.Load()
		locks := make([]backend.Claim, len(cases))
		for i, c := range cases {
			locks[i] = c.l
		}
		for i, err := range br.RefreshMany(ctx, locks) {
			if (err == nil) != cases[i].held {
				t.Errorf("%T: lock %d (%s): %v", br, i, cases[i].what, err)
			}
		}
		if n := cc.calls.Load() - calls; n != 1 {
			t.Errorf("%T: %d round trips with the scripts loaded, want 1", br, n)
		}
	}
}

// An empty batch costs nothing; a closed driver says so for every lock.
func TestRefreshManyEmptyAndClosed(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	d := openDriver(t)
	if errs := d.RefreshMany(testCtx(t), nil); len(errs) != 0 {
		t.Fatalf("RefreshMany(nil) = %v", errs)
	}
	d.Close()
	errs := d.RefreshMany(testCtx(t), make([]backend.Claim, 3))
	for i, err := range errs {
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("lock %d after Close: %v", i, err)
		}
	}
}

// BenchmarkRefreshMany compares, per lock, one RefreshMany of 100 locks
// with 100 Refresh calls one after the other, on one server and on the
// five-server quorum, and reports the ratio.
func BenchmarkRefreshMany(b *testing.B) {
	const n = 100
	run := func(b *testing.B, drv interface {
		backend.Driver
		backend.BatchRefresher
	}) {
		ctx := context.Background()
		locks := make([]backend.Claim, n)
		for i := range locks {
			locks[i] = backend.Claim{Key: backend.Key("redislock-bench", fmt.Sprintf("refresh-%s-%d", randHex(4), i)), Token: newToken(), TTL: 30 * time.Second}
			if _, err := drv.TryAcquire(ctx, locks[i]); err != nil {
				b.Fatal(err)
			}
		}
		defer func() {
			for _, l := range locks {
				drv.Release(ctx, l)
			}
		}()
		var batch, single time.Duration
		for b.Loop() {
			t := time.Now()
			for i, err := range drv.RefreshMany(ctx, locks) {
				if err != nil {
					b.Fatalf("RefreshMany, lock %d: %v", i, err)
				}
			}
			batch += time.Since(t)
			t = time.Now()
			for _, l := range locks {
				if err := drv.Refresh(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
			single += time.Since(t)
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) / n }
		b.ReportMetric(per(batch), "batch-µs/lock")
		b.ReportMetric(per(single), "single-µs/lock")
		b.ReportMetric(float64(single)/float64(batch), "single/batch")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("single", func(b *testing.B) {
		testenv.Require(b, testenv.RedisAddr())
		d, err := Open(context.Background(), "redis://"+testenv.RedisAddr()+"/0")
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		run(b, d)
	})
	b.Run("quorum", func(b *testing.B) {
		addrs := testenv.RedisQuorumAddrs()
		testenv.Require(b, addrs...)
		q, err := OpenQuorum(context.Background(), "redis+quorum://"+strings.Join(addrs, ",")+"/0")
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close()
		run(b, q)
	})
}
