package memcachelock

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkUncontended measures an uncontended acquire+release against the
// raw floor (floor.go: add plus delete) on the same driver (made by Open,
// so that the restart check runs), in alternating blocks of 50 of each,
// so that both see the same machine (its loopback round trips switch
// between a fast and a slow mode). "reused" takes one name again and again
// (its fence counter exists); "new" a new name per acquisition (no
// counter yet: the seeding path). Metrics: x-floor is the median over
// blocks of the ratio, x-floor-min and x-floor-max its range; floor-ns and
// lock-ns the median time of one pair; rt-ns one round trip (a gets).
//
// Both take two round trips, as the floor does (TestRoundTrips): the add
// carrying the fence drawn at the last release (reused) or a seed whose
// add of the counter goes in the same write (new), with a gets of the
// item and the counter; then the release's cas, with the incr that draws
// the next fence. The difference is the server's work per round trip.
func BenchmarkUncontended(b *testing.B) {
	for _, name := range []string{"reused", "new"} {
		b.Run(name, func(b *testing.B) { benchUncontended(b, name == "new") })
	}
}

func benchUncontended(b *testing.B, fresh bool) {
	testenv.Require(b, testenv.MemcacheAddr())
	d := openDriver(b, testenv.MemcacheAddr())
	ctx := context.Background()
	key := uniqueKey(b, "x")
	const block = 50
	var ratios, floors, locks []float64
	var rt time.Duration
	rts := 0
	// Warm the connections.
	floor, _ := measure.RawFloor(d)
	if err := floor(ctx, key); err != nil {
		b.Fatal(err)
	}
	n := 0
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		for range block {
			if err := floor(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for range block {
			k := key
			if fresh {
				n++
				k = key + "-" + strconv.Itoa(n)
			}
			l := backend.Claim{Key: k, Token: token(), TTL: time.Second}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		d.mc.Get(key + "-rtt")
		rt += time.Since(t2)
		rts++
		floor, ours := t1.Sub(t0), t2.Sub(t1)
		ratios = append(ratios, float64(ours)/float64(floor))
		floors = append(floors, float64(floor.Nanoseconds())/block)
		locks = append(locks, float64(ours.Nanoseconds())/block)
	}
	b.ReportMetric(median(ratios), "x-floor")
	b.ReportMetric(slices.Min(ratios), "x-floor-min")
	b.ReportMetric(slices.Max(ratios), "x-floor-max")
	b.ReportMetric(median(floors), "floor-ns")
	b.ReportMetric(median(locks), "lock-ns")
	b.ReportMetric(float64(rt.Nanoseconds())/float64(rts), "rt-ns")
	b.ReportMetric(0, "ns/op") // one op is a block pair: its time says nothing alone
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkClient measures TryAcquire+Release through locker.Client, with
// its watchdog, on one key.
func BenchmarkClient(b *testing.B) {
	testenv.Require(b, testenv.MemcacheAddr())
	c := openClient(b, testenv.MemcacheAddr(), locker.WithNamespace("mctest-"+randHex(4)))
	ctx := context.Background()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkContended: 8 workers on 2 clients (each its own memcache client
// and Driver) take one name in turn, each holding it 1ms, through the
// contended harness (internal/bench). memcached cannot notify: waiters are
// woken by their driver (see the package's Waiting); the round trip is a
// get on the first client, during the run. "listed": drivers made by Open,
// which know their server list (the pipelined fence and one-cas release);
// "client": by New, from the caller's client.
func BenchmarkContended(b *testing.B) {
	for _, listed := range []bool{true, false} {
		b.Run(map[bool]string{true: "listed", false: "client"}[listed], func(b *testing.B) { benchContended(b, listed) })
	}
}

func benchContended(b *testing.B, listed bool) {
	testenv.Require(b, testenv.MemcacheAddr())
	ns := "mctest-" + randHex(4)
	run := bench.Contend{Hold: time.Millisecond, Acquisitions: b.N, RoundTripOp: "get"}
	for i := range 2 {
		var d *Driver
		if listed {
			d = openDriver(b, testenv.MemcacheAddr())
		} else {
			mc := memcache.New(testenv.MemcacheAddr())
			b.Cleanup(func() { mc.Close() })
			d = mustNew(b, mc)
		}
		c, err := locker.New(d, locker.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		if i == 0 {
			run.RoundTrip = missRoundTrip(d, ns)
		}
		for range 4 {
			run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, "contended")})
		}
	}
	run.RunB(b).Summary().Report(b, "")
}

// tryCounting counts the TryAcquire calls the Client makes of its driver.
type tryCounting struct {
	*Driver
	n *atomic.Int64
}

func (d tryCounting) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	d.n.Add(1)
	return d.Driver.TryAcquire(ctx, c)
}

func (d tryCounting) Unwrap() backend.Driver { return d.Driver }

// BenchmarkScaleTries: 8 then 64 workers over 8 clients (drivers made by
// Open) on one name, each holding it 1ms, for 1.5s after a warm-up of
// 0.5s (as lockctl bench's scale workload; run it with -benchtime 1x).
// tries/acq is the TryAcquire calls the Clients made per acquisition
// after the warm-up (each reaches memcached).
func BenchmarkScaleTries(b *testing.B) {
	for _, workers := range []int{8, 64} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) { benchScaleTries(b, workers) })
	}
}

func benchScaleTries(b *testing.B, workers int) {
	testenv.Require(b, testenv.MemcacheAddr())
	ns := "mctest-" + randHex(4)
	const warmup = 500 * time.Millisecond
	run := bench.Contend{Hold: time.Millisecond, Duration: 1500 * time.Millisecond, Warmup: warmup, RoundTripOp: "get"}
	calls := new(atomic.Int64)
	for i := range 8 {
		d := openDriver(b, testenv.MemcacheAddr())
		c, err := locker.New(tryCounting{d, calls}, locker.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		if i == 0 {
			run.RoundTrip = missRoundTrip(d, ns)
		}
		for range workers / 8 {
			run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, "scale")})
		}
	}
	var calls0 atomic.Int64
	run.Start = time.Now()
	warm := time.AfterFunc(warmup, func() { calls0.Store(calls.Load()) })
	defer warm.Stop()
	s := run.RunB(b)
	s.Summary().Report(b, "")
	b.ReportMetric(float64(calls.Load()-calls0.Load())/float64(s.Acquisitions), "tries/acq")
}

// missRoundTrip is a contended run's round trip: a get that misses.
func missRoundTrip(d *Driver, ns string) func(context.Context) error {
	return func(context.Context) error {
		if _, err := d.mc.Get(ns + "-rtt"); err != nil && err != memcache.ErrCacheMiss {
			return err
		}
		return nil
	}
}
