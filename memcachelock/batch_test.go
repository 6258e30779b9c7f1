package memcachelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

var _ backend.BatchRefresher = (*Driver)(nil)

// maxGoroutines runs f while sampling runtime.NumGoroutine, and returns
// the most seen above the count before f.
func maxGoroutines(f func()) int {
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			if n := int64(runtime.NumGoroutine()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	return int(peak.Load()) - base - 1 // less the sampler
}

// mixedBatch builds, on d's server, a batch with one lock in each state:
// held (with an owner), held with flags we did not set, released, taken by
// another token, never existed, invalid TTL, invalid token. Held locks are
// stored for acqTTL; the batch refreshes with ttl.
func mixedBatch(t *testing.T, ctx context.Context, d backend.Driver, mc *memcache.Client, acqTTL, ttl time.Duration) (locks []backend.Claim, check func(errs []error)) {
	t.Helper()
	acquire := func(name, owner string) backend.Claim {
		l := backend.Claim{Key: uniqueKey(t, name), Token: token(), TTL: acqTTL, Owner: owner}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatalf("TryAcquire(%s): %v", name, err)
		}
		l.TTL, l.Fence = ttl, g.Fence
		return l
	}
	held := acquire("held", "job 7")
	flagged := backend.Claim{Key: uniqueKey(t, "flagged"), Token: token(), TTL: ttl}
	exp, _, _ := expiration(acqTTL, time.Now())
	if err := mc.Set(&memcache.Item{Key: lockKey(flagged.Key), Value: []byte(flagged.Token), Flags: 7, Expiration: exp}); err != nil {
		t.Fatal(err)
	}
	released := acquire("released", "")
	if err := d.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	taken := acquire("taken", "")
	taken.Token = token()
	never := backend.Claim{Key: uniqueKey(t, "never"), Token: token(), TTL: ttl}
	badTTL := held
	badTTL.TTL = 0
	badToken := held
	badToken.Token = "a b"
	locks = []backend.Claim{held, flagged, released, taken, never, badTTL, badToken}
	check = func(errs []error) {
		t.Helper()
		if len(errs) != len(locks) {
			t.Fatalf("%d errors for %d locks", len(errs), len(locks))
		}
		want := []struct {
			is  error
			say string
		}{
			{nil, ""}, {nil, ""},
			{backend.ErrNotHeld, "no lock (expired, evicted, released or the server restarted)"},
			{backend.ErrNotHeld, "another token holds it"},
			{backend.ErrNotHeld, "no lock (expired, evicted, released or the server restarted)"},
			{backend.ErrInvalidTTL, ""},
			{backend.ErrUnsupported, ""},
		}
		for i, w := range want {
			switch {
			case w.is == nil && errs[i] != nil:
				t.Errorf("slot %d: %v, want nil", i, errs[i])
			case w.is != nil && !errors.Is(errs[i], w.is):
				t.Errorf("slot %d: %v, want %v", i, errs[i], w.is)
			case w.say != "" && !strings.Contains(errs[i].Error(), w.say):
				t.Errorf("slot %d: %v, want %q", i, errs[i], w.say)
			}
		}
		// The values and flags are kept as they were.
		for _, c := range []struct {
			l     backend.Claim
			value string
			flags uint32
		}{{held, string(fencedValue(held.Token, held.Fence, "job 7")), 0}, {flagged, flagged.Token, 7}} {
			it, err := mc.Get(lockKey(c.l.Key))
			if err != nil {
				t.Fatalf("the refreshed item: %v", err)
			}
			if string(it.Value) != c.value || it.Flags != c.flags {
				t.Errorf("refreshed item: value %q flags %d, want %q, %d", it.Value, it.Flags, c.value, c.flags)
			}
		}
		if it, err := mc.Get(lockKey(taken.Key)); err != nil || heldBy(it.Value, taken.Token) {
			t.Errorf("the other holder's item: %v, %v", it, err)
		}
	}
	return locks, check
}

// A mixed batch: each slot gets its own outcome, in order, and the held
// locks live past their original expiry.
func TestRefreshManyMixed(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	mc := memcache.New(addr)
	defer mc.Close()
	d := openDriver(t, addr)

	// Stored for 3 s (TTL 1 s), gone by then; refreshed to 6 s (TTL 4 s).
	locks, check := mixedBatch(t, ctx, d, mc, time.Second, 4*time.Second)
	control := backend.Claim{Key: uniqueKey(t, "control"), Token: token(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, control); err != nil {
		t.Fatal(err)
	}
	refreshed := time.Now()
	trips := d.batch.trips.Load()
	errs := d.RefreshMany(ctx, locks)
	check(errs)
	if n := d.batch.trips.Load() - trips; n != 2 {
		t.Errorf("%d round trips, want 2 (gets, cas)", n)
	}
	for i, e := range errs {
		t.Logf("slot %d: %v", i, e)
	}

	// The originals expire within 3 s of their store; the refreshed ones
	// live at least 4 s from the refresh.
	time.Sleep(time.Until(refreshed.Add(3500 * time.Millisecond)))
	if _, err := mc.Get(lockKey(control.Key)); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("the unrefreshed control lock is still there (%v): the wait did not pass the original expiry", err)
	}
	for _, l := range locks[:2] {
		if it, err := mc.Get(lockKey(l.Key)); err != nil || !heldBy(it.Value, l.Token) {
			t.Errorf("refreshed lock %s is gone 3.5 s after its refresh: %v", l.Key, err)
		}
	}
	// Refreshing again works (a pooled connection) and the released one
	// stays not held.
	if errs := d.RefreshMany(ctx, locks[:3]); errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], backend.ErrNotHeld) {
		t.Errorf("second batch: %v", errs)
	}
}

// A Driver from New has no server list: it refreshes lock by lock, with
// the same outcomes.
func TestRefreshManyNew(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	mc := memcache.New(addr)
	defer mc.Close()
	d := mustNew(t, mc)
	defer d.Close()
	locks, check := mixedBatch(t, ctx, d, mc, time.Second, 4*time.Second)
	check(d.RefreshMany(ctx, locks))
	if d.batch.trips.Load() != 0 {
		t.Errorf("New's driver used batch connections")
	}
}

// A claim that Refresh would refuse (a permit's limit out of range, a bad
// token or TTL) gets that error in a batch, and the others go on.
func TestRefreshManyInvalid(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	d := openDriver(t, addr)
	ok := backend.Claim{Key: uniqueKey(t, "ok"), Token: token(), TTL: 5 * time.Second}
	if _, err := d.TryAcquire(ctx, ok); err != nil {
		t.Fatal(err)
	}
	errs := d.RefreshMany(ctx, []backend.Claim{
		{Key: uniqueKey(t, "p"), Token: token(), TTL: time.Second, Mode: backend.Permit, Limit: 0},
		{Key: uniqueKey(t, "t"), Token: "a b", TTL: time.Second},
		ok,
		{Key: uniqueKey(t, "ttl"), Token: token()},
	})
	for i, want := range []error{backend.ErrInvalidLimit, backend.ErrUnsupported, nil, backend.ErrInvalidTTL} {
		if !errors.Is(errs[i], want) {
			t.Errorf("claim %d: %v, want %v", i, errs[i], want)
		}
	}
}

// A batch whose cas finds an item changed since its gets (EXISTS) falls
// back to Refresh's path; a lock listed twice is refreshed once each.
func TestRefreshManyDuplicates(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	d := openDriver(t, addr)
	l := backend.Claim{Key: uniqueKey(t, "x"), Token: token(), TTL: time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	other := backend.Claim{Key: l.Key, Token: token(), TTL: time.Second}
	errs := d.RefreshMany(ctx, []backend.Claim{l, other, l})
	if errs[0] != nil || !errors.Is(errs[1], backend.ErrNotHeld) || errs[2] != nil {
		t.Fatalf("errs = %v", errs)
	}
}

// 500 locks cost one gets and one cas round trip, and no goroutine per lock.
func TestRefreshManyScale(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	d := openDriver(t, addr)
	const n = 500
	locks := make([]backend.Claim, n)
	for i := range locks {
		locks[i] = backend.Claim{Key: uniqueKey(t, fmt.Sprint(i)), Token: token(), TTL: 10 * time.Second}
		if _, err := d.TryAcquire(ctx, locks[i]); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		trips, dials := d.batch.trips.Load(), d.probes.dials.Load()
		var errs []error
		start := time.Now()
		extra := maxGoroutines(func() { errs = d.RefreshMany(ctx, locks) })
		took := time.Since(start)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("lock %d: %v", i, err)
			}
		}
		gotTrips, gotDials := d.batch.trips.Load()-trips, d.probes.dials.Load()-dials
		t.Logf("round %d: %d locks in %v: %d round trips, %d dials, at most %d extra goroutines", round, n, took, gotTrips, gotDials, extra)
		if gotTrips != 2 {
			t.Errorf("%d round trips, want 2", gotTrips)
		}
		if round == 1 && gotDials != 0 {
			t.Errorf("%d dials with a pooled connection", gotDials)
		}
		if extra > 3 {
			t.Errorf("%d extra goroutines during the batch", extra)
		}
	}
	for _, l := range locks {
		d.Release(ctx, l)
	}
}

// Through locker.Client: 2,000 locks with TTL 3 s, refreshed automatically
// for 4 s, none lost, with few refresh calls and goroutines. (With 1 s, a
// round of 2,000 refreshes that a loaded machine runs late by more than
// the 0.67 s to spare loses locks, as it rightly does.)
func TestRefreshManyClient(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, 2*time.Minute)
	c := openClient(t, addr, locker.WithNamespace("mctest-"+randHex(4)), locker.WithDefaultTTL(3*time.Second))
	d := c.Driver().(*Driver)
	const n = 2000
	base := runtime.NumGoroutine()
	calls0, trips0 := d.batch.calls.Load(), d.batch.trips.Load()
	locks := make([]*locker.Lock, 0, n)
	start := time.Now()
	for i := range n {
		l, err := c.TryAcquire(ctx, fmt.Sprint("l", i))
		if err != nil {
			t.Fatalf("TryAcquire %d: %v", i, err)
		}
		locks = append(locks, l)
	}
	acquired := time.Now()
	t.Logf("acquired %d locks in %v", n, acquired.Sub(start))
	calls1, trips1, locks1 := d.batch.calls.Load(), d.batch.trips.Load(), d.batch.locks.Load()
	peak := 0
	var perSecond []string
	lastCalls, lastLocks, next := calls1, locks1, acquired.Add(time.Second)
	for time.Since(acquired) < 4*time.Second {
		peak = max(peak, runtime.NumGoroutine()-base)
		time.Sleep(5 * time.Millisecond)
		if time.Now().After(next) {
			c, l := d.batch.calls.Load(), d.batch.locks.Load()
			perSecond = append(perSecond, fmt.Sprintf("%d calls, %d locks", c-lastCalls, l-lastLocks))
			lastCalls, lastLocks, next = c, l, next.Add(time.Second)
		}
	}
	t.Logf("per second: %s", strings.Join(perSecond, "; "))
	held := time.Since(acquired)
	calls, trips := d.batch.calls.Load()-calls1, d.batch.trips.Load()-trips1
	batched := d.batch.locks.Load() - locks1
	lost := 0
	for _, l := range locks {
		select {
		case <-l.Lost():
			if lost++; lost <= 3 {
				t.Errorf("lost %s: %v", l.Name(), l.Err())
			}
		default:
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d locks lost", lost, n)
	}
	t.Logf("held %d locks for %v: %d RefreshMany calls (%.1f/s) for %d lock refreshes (%.1f per call), %d round trips; during acquisition %d calls, %d round trips; at most %d extra goroutines",
		n, held, calls, float64(calls)/held.Seconds(), batched, float64(batched)/float64(max(calls, 1)), trips, calls1-calls0, trips1-trips0, peak)
	// One by one, each refresh would be a call of its own. The watchdog's
	// batches grow while the holds' due times gather (about 10 locks per
	// call in the first second after 2,000 acquisitions spread over 1.5 s,
	// about 30 in the fourth).
	if float64(batched)/float64(max(calls, 1)) < 5 {
		t.Errorf("%.1f locks per RefreshMany call: hardly batched", float64(batched)/float64(max(calls, 1)))
	}
	if peak > 70 {
		t.Errorf("%d extra goroutines while holding %d locks", peak, n)
	}
	for _, l := range locks {
		l.Release(ctx)
	}
}

// On a blackholed connection a batch returns at ctx's deadline, or soon
// after ctx is cancelled, sooner than the client's timeout, with errors
// that are not ErrNotHeld.
func TestRefreshManyCutOff(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := openDriver(t, p.Addr()) // timeout 500 ms
	locks := make([]backend.Claim, 10)
	for i := range locks {
		locks[i] = backend.Claim{Key: uniqueKey(t, fmt.Sprint(i)), Token: token(), TTL: 10 * time.Second}
		if _, err := d.TryAcquire(ctx, locks[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range d.RefreshMany(ctx, locks) { // a pooled connection
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
	}
	p.Blackhole()
	checkCut := func(what string, errs []error, took, late time.Duration) {
		t.Helper()
		t.Logf("%s: returned after %v, %v after its context ended: %v", what, took, late, errs[0])
		if bound := 150 * time.Millisecond; late > bound {
			t.Errorf("%s: returned %v after its context ended, want at most %v", what, late, bound)
		}
		for i, err := range errs {
			if err == nil || errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("%s: lock %d: %v, want an error other than ErrNotHeld", what, i, err)
			}
		}
	}
	// cut runs RefreshMany with ctx and checks that it returned at most
	// 150ms after ctx ended, as a goroutine of its own saw the end (a
	// loaded machine fires the deadline's timer, or runs the cancel, late:
	// that is not the driver's lateness), well before the driver's own
	// 500ms timeout.
	cut := func(what string, ctx context.Context) {
		t.Helper()
		ended := make(chan time.Time, 1)
		context.AfterFunc(ctx, func() { ended <- time.Now() })
		start := time.Now()
		errs := d.RefreshMany(ctx, locks)
		returned := time.Now()
		var late time.Duration
		if ctx.Err() != nil { // else it returned before ctx ended
			late = returned.Sub(<-ended)
		}
		checkCut(what, errs, returned.Sub(start), late)
	}
	for _, pooled := range []bool{true, false} {
		if !pooled {
			d.probes.close() // every batch dials: the proxy accepts, then drops
			d.probes.closed = false
		}
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		cut(fmt.Sprintf("deadline, first %v", pooled), dctx)
		cancel()

		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		cut(fmt.Sprintf("cancel, first %v", pooled), cctx)
	}
	p.Heal()
	for i, err := range d.RefreshMany(ctx, locks) {
		if err != nil {
			t.Errorf("after Heal, lock %d: %v", i, err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, err := range d.RefreshMany(ctx, locks[:2]) {
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
	}
}

// BenchmarkRefreshMany compares the per-lock cost of refreshing 100 locks
// in one RefreshMany with 100 Refresh calls, interleaved in one run.
// Metrics: batch-ns and single-ns per lock; x-single, their ratio; dial-ns
// per lock for batches that dial their connection each time (no pool).
func BenchmarkRefreshMany(b *testing.B) {
	addr := testenv.MemcacheAddr()
	testenv.Require(b, addr)
	ctx := context.Background()
	d := openDriver(b, addr)
	nd := openDriver(b, addr)
	nd.probes.close() // keeps no connection: each batch dials
	nd.probes.closed = true
	const n = 100
	locks := make([]backend.Claim, n)
	for i := range locks {
		locks[i] = backend.Claim{Key: uniqueKey(b, fmt.Sprint(i)), Token: token(), TTL: 30 * time.Second}
		if _, err := d.TryAcquire(ctx, locks[i]); err != nil {
			b.Fatal(err)
		}
	}
	var batch, single, dial time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		for _, err := range d.RefreshMany(ctx, locks) {
			if err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for _, l := range locks {
			if err := d.Refresh(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		for _, err := range nd.RefreshMany(ctx, locks) {
			if err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		if i == 0 {
			continue // the first round dials
		}
		batch += t1.Sub(t0)
		single += t2.Sub(t1)
		dial += t3.Sub(t2)
	}
	rounds := float64(max(b.N-1, 1)) * n
	b.ReportMetric(float64(batch.Nanoseconds())/rounds, "batch-ns/lock")
	b.ReportMetric(float64(single.Nanoseconds())/rounds, "single-ns/lock")
	b.ReportMetric(float64(dial.Nanoseconds())/rounds, "dial-ns/lock")
	b.ReportMetric(float64(batch)/float64(max(single, 1)), "x-single")
}

// With two servers a batch costs two round trips per server. After a
// restart, a pooled connection the server closed is replaced at once: the
// batch reports the forgotten locks as not held, not an error.
func TestRefreshManyServers(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	ctx := testCtx(t, time.Minute)
	priv := testenv.StartMemcached(t)
	// A new private server refuses fresh names for a TTL unless told not to.
	drv, err := Open(ctx, "memcache://"+addr+","+priv.Addr, WithRestartDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	d := drv
	defer d.Close()
	locks := make([]backend.Claim, 200)
	on := map[string]int{}
	for i := range locks {
		locks[i] = backend.Claim{Key: uniqueKey(t, fmt.Sprint(i)), Token: token(), TTL: 10 * time.Second}
		if _, err := d.TryAcquire(ctx, locks[i]); err != nil {
			t.Fatal(err)
		}
		a, _ := d.servers.PickServer(lockKey(locks[i].Key))
		on[a.String()]++
	}
	if len(on) != 2 {
		t.Fatalf("the locks live on %v", on)
	}
	trips := d.batch.trips.Load()
	for i, err := range d.RefreshMany(ctx, locks) {
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
	}
	if n := d.batch.trips.Load() - trips; n != 4 {
		t.Errorf("%d round trips for 2 servers, want 4", n)
	}
	if err := priv.Restart(); err != nil {
		t.Fatal(err)
	}
	dials := d.probes.dials.Load()
	lost := 0
	for i, err := range d.RefreshMany(ctx, locks) {
		a, _ := d.servers.PickServer(lockKey(locks[i].Key))
		switch {
		case a.String() == priv.Addr && errors.Is(err, backend.ErrNotHeld):
			lost++
		case a.String() != priv.Addr && err == nil:
		default:
			t.Errorf("lock %d on %s after the restart: %v", i, a, err)
		}
	}
	t.Logf("locks per server %v; after the restart %d not held, %d new connections", on, lost, d.probes.dials.Load()-dials)
	if lost != on[priv.Addr] {
		t.Errorf("%d locks found not held, want %d", lost, on[priv.Addr])
	}
}

// fakeMemcached answers gets with the values it was given and each cas
// with the next scripted reply (STORED once they run out).
func fakeMemcached(t *testing.T, values map[string]string, script []string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	serve := func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			f := strings.Fields(line)
			var out strings.Builder
			switch {
			case len(f) > 1 && (f[0] == "gets" || f[0] == "get"):
				for _, k := range f[1:] {
					if v, ok := values[k]; ok {
						fmt.Fprintf(&out, "VALUE %s 0 %d 42\r\n%s\r\n", k, len(v), v)
					}
				}
				out.WriteString("END\r\n")
			case len(f) == 6 && f[0] == "cas":
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				mu.Lock()
				reply := "STORED"
				if len(script) > 0 {
					reply, script = script[0], script[1:]
				}
				mu.Unlock()
				out.WriteString(reply + "\r\n")
			default:
				out.WriteString("ERROR\r\n")
			}
			if _, err := c.Write([]byte(out.String())); err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serve(c) })
		}
	})
	return ln.Addr().String()
}

// Each cas reply lands in its own slot; a reply out of step with the
// commands fails that lock and the rest, never reports them refreshed.
func TestRefreshManyReplies(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	locks := make([]backend.Claim, 6)
	values := map[string]string{}
	for i := range locks {
		locks[i] = backend.Claim{Key: uniqueKey(t, fmt.Sprint(i)), Token: token(), TTL: time.Second}
		values[lockKey(locks[i].Key)] = locks[i].Token
	}
	addr := fakeMemcached(t, values, []string{"STORED", "SERVER_ERROR out of memory storing object", "EXISTS", "NOT_FOUND", "BOGUS"})
	var sl memcache.ServerList
	if err := sl.SetServers(addr); err != nil {
		t.Fatal(err)
	}
	d := &Driver{mc: memcache.NewFromSelector(&sl), own: true, servers: &sl}
	defer d.Close()
	errs := d.RefreshMany(ctx, locks)
	for i, e := range errs {
		t.Logf("slot %d: %v", i, e)
	}
	// The EXISTS is retried by Refresh's path, which the fake then stores.
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("slots 0 and 2: %v, %v; want nil", errs[0], errs[2])
	}
	if !errors.Is(errs[3], backend.ErrNotHeld) || !strings.Contains(errs[3].Error(), "it expired or was evicted just now") {
		t.Errorf("slot 3: %v, want ErrNotHeld", errs[3])
	}
	for _, i := range []int{1, 4, 5} {
		if errs[i] == nil || errors.Is(errs[i], backend.ErrNotHeld) {
			t.Errorf("slot %d: %v, want an error other than ErrNotHeld", i, errs[i])
		}
	}
}
