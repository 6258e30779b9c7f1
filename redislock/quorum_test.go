package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

func openTestQuorum(t *testing.T, addrs []string) *Quorum {
	t.Helper()
	q, err := OpenQuorum(testCtx(t), "redis+quorum://"+strings.Join(addrs, ",")+"/0")
	if err != nil {
		t.Fatalf("OpenQuorum: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// privateQuorum starts five private servers for a quorum, so that the
// test neither sees nor disturbs the shared ones (redis-q1..q5), which
// other tests and other runs use meanwhile: a test that stops servers
// stops these.
func privateQuorum(t *testing.T) ([]*testenv.Server, []string) {
	t.Helper()
	var srvs []*testenv.Server
	var addrs []string
	for range 5 {
		s := testenv.StartRedis(t)
		srvs, addrs = append(srvs, s), append(addrs, s.Addr)
	}
	return srvs, addrs
}

// With three of five servers stopped, acquisition fails with an error that
// says so, and leaves nothing held on the two that answer; a blocked
// Acquire returns that error (after the locker package's retry window)
// rather than waiting forever.
func TestQuorumThreeDown(t *testing.T) {
	srvs, addrs := privateQuorum(t)
	ctx := testCtx(t)
	q := openTestQuorum(t, addrs)
	c, err := locker.New(q, locker.WithNamespace("redislock-q3down"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	admins := []*redis.Client{adminClient(t, addrs[0]), adminClient(t, addrs[1])}
	for _, s := range srvs[2:] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	name := "q3down-" + randHex(4)
	key := backend.Key("redislock-q3down", name)
	for _, try := range []func() error{
		func() error { _, err := c.TryAcquire(ctx, name); return err },
		func() error {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := c.Acquire(actx, name)
			return err
		},
	} {
		start := time.Now()
		err := try()
		if err == nil {
			t.Fatalf("acquired with 3 of 5 servers down")
		}
		// TryAcquire fails at once; a blocking Acquire retries errors for
		// the locker package's retry window (5s) and then returns the error.
		if errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 8*time.Second {
			t.Fatalf("took %v and returned %v: want an error within the retry window", time.Since(start), err)
		}
		if !strings.Contains(err.Error(), "only 2 of 5 servers answered, 3 needed") {
			t.Fatalf("error %q does not say that too few servers answered", err)
		}
		// Each silent server is named, typed: the first is the third.
		var se *ServerError
		if !errors.As(err, &se) || se.Addr != addrs[2] || se.Err == nil {
			t.Fatalf("error %q: errors.As found %+v, want the third server's ServerError", err, se)
		}
		t.Logf("error: %v", err)
		for i, a := range admins {
			if n, err := a.Exists(ctx, keysFor(key).lock).Result(); err != nil || n != 0 {
				t.Fatalf("server %d holds the lock after the failed acquisition (%d, %v)", i+1, n, err)
			}
		}
	}
	// Open itself refuses a quorum it cannot reach.
	if _, err := OpenQuorum(ctx, "redis+quorum://"+strings.Join(addrs, ",")+"/0"); err == nil || !strings.Contains(err.Error(), "2 of 5 servers answered") {
		t.Fatalf("OpenQuorum with 3 of 5 down = %v", err)
	}
}

// Different majorities grant successive holders, and the fence still
// increases. The servers' counters are set so that, without raising the
// granting servers' counters to the fence, the second holder would get a
// smaller fence than the first. Which servers grant is steered by holding
// the lock on the others with a foreign token.
func TestQuorumFenceAcrossMajorities(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	q := openTestQuorum(t, addrs)
	var admins []*redis.Client
	for _, a := range addrs {
		admins = append(admins, adminClient(t, a))
	}
	key := uniqueKey(t)
	// Far in the future, so the clock never dominates in this test.
	const base = uint64(1) << 52
	counters := []uint64{base + 100, base + 10, base + 10, base + 10, base + 10}
	for i, a := range admins {
		if err := a.Set(ctx, keysFor(key).fence, strconv.FormatUint(counters[i], 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		defer a.Del(context.Background(), keysFor(key).fence)
	}
	block := func(servers ...int) func() {
		for _, i := range servers {
			admins[i].Set(ctx, keysFor(key).lock, "foreign", 10*time.Second)
		}
		return func() {
			for _, i := range servers {
				admins[i].Del(ctx, keysFor(key).lock)
			}
		}
	}
	counter := func(i int) uint64 {
		v, err := admins[i].Get(ctx, keysFor(key).fence).Uint64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// A: servers 0, 1, 2 grant, with 101, 11, 11.
	unblock := block(3, 4)
	a := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
	ga, err := q.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if ga.Fence != base+101 {
		t.Fatalf("A's fence = %d, want base+101", ga.Fence-base)
	}
	for i := range 3 {
		if c := counter(i); c < ga.Fence {
			t.Fatalf("server %d's counter is base+%d after A's grant, below A's fence", i, c-base)
		}
	}
	if err := q.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	unblock()

	// B: servers 2, 3, 4 grant; only server 2 was in A's majority.
	unblock = block(0, 1)
	defer unblock()
	b := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
	gb, err := q.TryAcquire(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	// Without the raise, server 2 would have counted 12, servers 3 and 4
	// 11: B's fence would be base+12 < base+101.
	if gb.Fence <= ga.Fence {
		t.Fatalf("B's fence base+%d is not above A's base+%d", gb.Fence-base, ga.Fence-base)
	}
	if err := q.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// The same with real outages: the first holder's majority is servers 1-3
// (4 and 5 stopped), the second's 3-5 (1 and 2 stopped, 4 and 5 restarted
// without their data).
func TestQuorumFenceAcrossOutages(t *testing.T) {
	srvs, addrs := privateQuorum(t)
	ctx := testCtx(t)
	q := openTestQuorum(t, addrs)
	key := uniqueKey(t)
	var fences []uint64
	take := func() {
		t.Helper()
		l := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
		// The first request to a restarted server may fail on a pooled
		// connection to its previous incarnation (quorum servers are not
		// retried): try again, as a waiting Acquire would.
		var g backend.Grant
		var err error
		for range 5 {
			if g, err = q.TryAcquire(ctx, l); err == nil {
				break
			}
			t.Logf("TryAcquire: %v", err)
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, g.Fence)
		if err := q.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	// each runs Stop or Start on the servers numbered (from 1) in is.
	each := func(op func(*testenv.Server) error, is ...int) {
		t.Helper()
		for _, i := range is {
			if err := op(srvs[i-1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	take()
	each((*testenv.Server).Stop, 4, 5)
	take()
	each((*testenv.Server).Start, 4, 5)
	each((*testenv.Server).Stop, 1, 2)
	take()
	each((*testenv.Server).Start, 1, 2)
	take()
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences %v do not increase", fences)
		}
	}
}

// Of simultaneous TryAcquire calls on a free lock, exactly one wins, even
// though they can split the servers' votes.
func TestQuorumSimultaneousTries(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	qs := []*Quorum{openTestQuorum(t, addrs), openTestQuorum(t, addrs), openTestQuorum(t, addrs), openTestQuorum(t, addrs)}
	const rounds, tries = 30, 12
	zero := 0
	for r := range rounds {
		key := uniqueKey(t)
		var wins atomic.Int32
		var held []backend.Claim
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range tries {
			wg.Go(func() {
				l := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
				<-start
				_, err := qs[i%len(qs)].TryAcquire(ctx, l)
				switch {
				case err == nil:
					wins.Add(1)
					mu.Lock()
					held = append(held, l)
					mu.Unlock()
				case !errors.Is(err, backend.ErrNotAcquired):
					t.Errorf("round %d: %v", r, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := wins.Load(); n > 1 {
			t.Fatalf("round %d: %d winners", r, n)
		} else if n == 0 {
			zero++
		}
		for _, l := range held {
			qs[0].Release(ctx, l)
		}
	}
	t.Logf("%d of %d rounds had no winner", zero, rounds)
	if zero > rounds/10 {
		t.Fatalf("%d of %d rounds of simultaneous tries had no winner", zero, rounds)
	}
}

// Refresh and Release decide by majority: with the lock gone from three
// servers, a refresh proves it lost; with two, it still holds.
func TestQuorumRefreshMajority(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	q := openTestQuorum(t, addrs)
	var admins []*redis.Client
	for _, a := range addrs {
		admins = append(admins, adminClient(t, a))
	}
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 5 * time.Second}
	if _, err := q.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	// Each server keeps it for TTL + the drift allowance. (TryAcquire
	// returns once a majority granted: the others' grants may still be on
	// their way.)
	for i, a := range admins {
		pttl, err := a.PTTL(ctx, keysFor(l.Key).lock).Result()
		for deadline := time.Now().Add(2 * time.Second); err == nil && pttl < 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
			pttl, err = a.PTTL(ctx, keysFor(l.Key).lock).Result()
		}
		if err != nil || pttl <= l.TTL || pttl > l.TTL+100*time.Millisecond {
			t.Fatalf("server %d: PTTL %v (err %v), want a little over %v", i, pttl, err, l.TTL)
		}
	}
	admins[0].Del(ctx, keysFor(l.Key).lock)
	admins[1].Del(ctx, keysFor(l.Key).lock)
	if err := q.Refresh(ctx, l); err != nil {
		t.Fatalf("Refresh held by 3 of 5: %v", err)
	}
	admins[2].Del(ctx, keysFor(l.Key).lock)
	if err := q.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Refresh held by 2 of 5 = %v, want ErrNotHeld", err)
	}
	if err := q.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release held by 2 of 5 = %v, want ErrNotHeld", err)
	}
	// Release returned once it could tell; the releases it sent still
	// land on the servers that held the key.
	for i, a := range admins {
		deadline := time.Now().Add(2 * time.Second)
		for {
			n, err := a.Exists(ctx, keysFor(l.Key).lock).Result()
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %d still has the key 2s after Release (%d, %v)", i, n, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// blackhole accepts connections and never answers, like a server behind a
// network partition that drops packets.
func blackhole(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// Two of five servers silent (partitioned, not refusing): every operation
// completes with the three that answer, without waiting for the silent ones.
func TestQuorumTwoSilent(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	var clients []redis.UniversalClient
	for _, a := range []string{addrs[0], blackhole(t), addrs[1], blackhole(t), addrs[2]} {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		defer c.Close()
		clients = append(clients, c)
	}
	q, err := NewQuorum(clients)
	if err != nil {
		t.Fatal(err)
	}
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 10 * time.Second}
	start := time.Now()
	if _, err := q.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := q.Refresh(ctx, l); err != nil {
		t.Fatal(err)
	}
	ch, cancel, err := q.Subscribe(ctx, l.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no release notification")
	}
	cancel()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("acquire, refresh, subscribe and release took %v with two silent servers", took)
	}
	t.Logf("acquire, refresh, subscribe and release took %v with two silent servers", time.Since(start).Round(time.Millisecond))
	// Close waits for the silent servers' requests, which the caller's
	// clients' timeouts bound (here 1s each).
	start = time.Now()
	q.Close()
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Close took %v", took)
	}
	t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))

	// Opened from a URL, the Quorum owns its clients: Open does not wait
	// for the silent servers, and Close cuts their requests short.
	start = time.Now()
	q, err = OpenQuorum(ctx, "redis+quorum://"+strings.Join([]string{addrs[0], blackhole(t), addrs[1], blackhole(t), addrs[2]}, ",")+"/0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := q.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("OpenQuorum, acquire, release and Close took %v with two silent servers", took)
	}
}

// A server that is slow to answer is not waited for, and when its grant
// arrives after the lock was released (its request overtaken by the
// release's), the grant is released at once instead of holding the name
// on that server until it expires.
func TestQuorumLateGrantAfterRelease(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	// The first connection to the fifth server is slow, so the release,
	// which finds it busy and opens another, overtakes the acquisition.
	slow := newDelayProxy(t, addrs[4], 300*time.Millisecond)
	slow.mu.Lock()
	slow.slowN = 1
	slow.mu.Unlock()
	var clients []redis.UniversalClient
	for _, a := range []string{addrs[0], addrs[1], addrs[2], addrs[3], slow.addr()} {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		defer c.Close()
		clients = append(clients, c)
	}
	q, err := NewQuorum(clients)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	admin := adminClient(t, addrs[4])
	for range 3 {
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: 10 * time.Second}
		start := time.Now()
		if _, err := q.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := q.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 250*time.Millisecond {
			t.Errorf("acquire and release took %v: they waited for the slow server", took)
		}
		deadline := time.Now().Add(3 * time.Second)
		for {
			n, err := admin.Exists(ctx, keysFor(l.Key).lock).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 && time.Since(start) > 700*time.Millisecond {
				break // the late grant came and went
			}
			if time.Now().After(deadline) {
				t.Fatalf("the slow server still holds the released lock %v after the release", time.Since(start))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// The restart check stays in force with the proven variant of the acquire
// script (upproof.go), for a Quorum's servers and a Driver's: once a
// server has run long enough, new names cost it no INFO; after a restart
// without persistence the variant is gone, and the server refuses new
// names again for the restart delay.
func TestQuorumRestartCheckWithoutInfo(t *testing.T) { restartCheckWithoutInfo(t, true) }

func TestRestartCheckWithoutInfo(t *testing.T) { restartCheckWithoutInfo(t, false) }

func restartCheckWithoutInfo(t *testing.T, quorum bool) {
	t.Parallel()
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	addr := srv.Addr
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	var d backend.Driver
	var up *uptime
	if quorum {
		q, err := NewQuorum([]redis.UniversalClient{rdb}, withTTLRestartDelay())
		if err != nil {
			t.Fatal(err)
		}
		d, up = q, q.deps[0].up
	} else {
		dr, err := New(rdb, withTTLRestartDelay())
		if err != nil {
			t.Fatal(err)
		}
		d, up = dr, dr.dep.up
	}
	defer d.Close()
	admin := adminClient(t, addr)
	// A TTL of 1s: the restart delay is px, a little over 1s.
	try := func() error {
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Second}
		_, err := d.TryAcquire(ctx, l)
		if err == nil {
			d.Release(ctx, l)
		}
		return err
	}
	// A free name refused: the server is too new, and the refusal says so.
	err := try()
	var why *backend.NotAcquiredError
	if !errors.As(err, &why) || !strings.Contains(why.Reason, "started less than a TTL ago") {
		t.Fatalf("a new server's refusal of a new name: %v, want the delayed restart as its reason", err)
	}
	// The delay is px: a Driver's 1s, a Quorum's a little more, which the
	// variant for 2s covers, past 3s of uptime.
	need := int64(1000)
	if quorum {
		need = 2000
	}
	deadline := time.Now().Add(15 * time.Second)
	for s := up.script.Load(); s == nil || s.upMs < need; s = up.script.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no variant learned in 15s")
		}
		try()
		time.Sleep(100 * time.Millisecond)
	}
	infos := func() int64 {
		m, err := admin.InfoMap(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, n, _ := strings.Cut(m["Commandstats"]["cmdstat_info"], "calls=")
		n, _, _ = strings.Cut(n, ",")
		v, _ := strconv.ParseInt(n, 10, 64)
		return v
	}
	before := infos()
	for range 20 {
		if err := try(); err != nil {
			t.Fatal(err)
		}
	}
	// One INFO is the first reading's own.
	if n := infos() - before - 1; n != 0 {
		t.Fatalf("20 acquisitions of new names ran INFO %d times", n)
	}

	// Restarted without its data: the variant's EVALSHA meets NOSCRIPT,
	// and the plain script refuses. The first request may fail on a
	// pooled connection to the old process.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		err := try()
		if errors.Is(err, backend.ErrNotAcquired) {
			break
		}
		if err == nil || i == 5 {
			t.Fatalf("the restarted server: %v, want a refusal", err)
		}
		t.Logf("after the restart: %v", err)
	}
	if s := up.script.Load(); s != nil {
		t.Fatalf("the variant for %dms of uptime is still in use after the restart", s.upMs)
	}
}

// A contended name (quorum_hot.go): attempts ask the name's first server
// before the others, the lock stays exclusive with increasing fences, and
// nothing is left on any server at the end.
func TestQuorumHotName(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	qs := []*Quorum{openTestQuorum(t, addrs), openTestQuorum(t, addrs), openTestQuorum(t, addrs)}
	key := uniqueKey(t)
	const workers, grants = 6, 120
	var (
		mu       sync.Mutex
		holders  int
		fences   []uint64
		arbiter  atomic.Int32 // refusals at the first server
		deadline = time.Now().Add(30 * time.Second)
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			q := qs[w%len(qs)]
			for time.Now().Before(deadline) {
				mu.Lock()
				done := len(fences) >= grants
				mu.Unlock()
				if done {
					return
				}
				l := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
				g, err := q.TryAcquire(ctx, l)
				if err != nil {
					if !errors.Is(err, backend.ErrNotAcquired) {
						t.Errorf("TryAcquire: %v", err)
						return
					}
					if strings.Contains(err.Error(), "first server") {
						arbiter.Add(1)
					}
					time.Sleep(time.Duration(w) * 100 * time.Microsecond)
					continue
				}
				mu.Lock()
				holders++
				if holders > 1 {
					t.Errorf("%d holders at once", holders)
				}
				if n := len(fences); n > 0 && g.Fence <= fences[n-1] {
					t.Errorf("fence %d after %d", g.Fence, fences[n-1])
				}
				fences = append(fences, g.Fence)
				mu.Unlock()
				time.Sleep(200 * time.Microsecond)
				mu.Lock()
				holders--
				mu.Unlock()
				if err := q.Release(ctx, l); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if len(fences) < grants {
		t.Fatalf("%d grants in 30s, want %d", len(fences), grants)
	}
	if arbiter.Load() == 0 {
		t.Fatal("no attempt was refused by the name's first server: the hot path was not taken")
	}
	t.Logf("%d grants, %d refusals at the first server", len(fences), arbiter.Load())
	for i, a := range addrs {
		admin := adminClient(t, a)
		waitGone := time.Now().Add(3 * time.Second)
		for {
			n, err := admin.Exists(ctx, keysFor(key).lock).Result()
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(waitGone) {
				t.Fatalf("server %d still holds the name (%d, %v)", i+1, n, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// A Release that returned has freed the name for an attempt made right
// after it, even one on a hot name, which asks the name's arbiter alone
// first: the release waits for the arbiter's answer too (briefly), so a
// slower arbiter does not refuse a TryAcquire made after Release returned.
// The releasing client reaches the arbiter through a proxy that delays
// each direction 20ms, the other servers directly.
func TestQuorumReleaseReachesArbiter(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	ctx := testCtx(t)
	key := uniqueKey(t)
	direct := quorumOf(t, addrs)
	arb := direct.arbiter(key)
	p, err := faultproxy.New(addrs[arb])
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Delay(20*time.Millisecond, 20*time.Millisecond)
	slowAddrs := slices.Clone(addrs)
	slowAddrs[arb] = p.Addr()
	slow := quorumOf(t, slowAddrs)
	arbiter := redis.NewClient(&redis.Options{Addr: addrs[arb]})
	defer arbiter.Close()
	for round := range 5 {
		a := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
		if _, err := slow.TryAcquire(ctx, a); err != nil {
			t.Fatalf("round %d: TryAcquire through the slow arbiter: %v", round, err)
		}
		// It returned at a majority: wait until the arbiter has a's
		// grant too, as a lock held for a while has.
		for i := 0; ; i++ {
			if v, _ := arbiter.Get(ctx, lockKeys(key)[0]).Result(); strings.Contains(v, a.Token) {
				break
			}
			if i == 200 {
				t.Fatalf("round %d: the arbiter never got the grant", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Refused while a holds it: the name is hot for direct.
		b := backend.Claim{Key: key, Token: newToken(), TTL: 5 * time.Second}
		if _, err := direct.TryAcquire(ctx, b); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("round %d: TryAcquire of a held name = %v, want ErrNotAcquired", round, err)
		}
		if err := slow.Release(ctx, a); err != nil {
			t.Fatalf("round %d: Release: %v", round, err)
		}
		if _, err := direct.TryAcquire(ctx, b); err != nil {
			t.Fatalf("round %d: TryAcquire right after the Release returned: %v", round, err)
		}
		if err := direct.Release(ctx, b); err != nil {
			t.Fatalf("round %d: Release: %v", round, err)
		}
	}
}

// quorumOf opens a Quorum over addrs, closed with the test.
func quorumOf(t *testing.T, addrs []string) *Quorum {
	t.Helper()
	var clients []redis.UniversalClient
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	q, err := NewQuorum(clients)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}
