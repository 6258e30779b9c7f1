package memcachelock

import (
	"context"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkUncontended measures an uncontended acquire+release against the
// raw floor, add plus delete, on the same client, interleaved in one run so
// that both see the same machine. Metrics: x-floor is the ratio; floor-ns
// and lock-ns the time of one pair; rt-ns one round trip (a gets).
//
// A correct lock cannot reach the floor's two round trips: the acquisition
// is add, incr (the fence), gets and cas (the confirmation that the fence
// was drawn while holding, which records it in the item), and the release
// gets and cas, since memcached has no compare-and-delete and a bare delete
// can free the next holder's lock. That is six round trips, so the ratio is
// about 3.
func BenchmarkUncontended(b *testing.B) {
	testenv.Require(b, testenv.MemcacheAddr())
	mc := memcache.New(testenv.MemcacheAddr())
	defer mc.Close()
	d := mustNew(b, mc)
	defer d.Close()
	ctx := context.Background()
	key := uniqueKey(b, "x")
	floorKey := lockKey(key) + "-floor"
	floorItem := &memcache.Item{Key: floorKey, Value: []byte(token()), Expiration: 2}
	tokens := make([]string, 1024)
	for i := range tokens {
		tokens[i] = token()
	}
	var floor, ours, rt time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if err := mc.Add(floorItem); err != nil {
			b.Fatal(err)
		}
		if err := mc.Delete(floorKey); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		l := backend.Claim{Key: key, Token: tokens[i%len(tokens)], TTL: time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		mc.Get(floorKey)
		t3 := time.Now()
		floor += t1.Sub(t0)
		ours += t2.Sub(t1)
		rt += t3.Sub(t2)
		if i == 0 {
			floor, ours, rt = 0, 0, 0 // the first pair dials connections
		}
	}
	n := float64(max(b.N-1, 1))
	b.ReportMetric(float64(ours)/float64(floor), "x-floor")
	b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns")
	b.ReportMetric(float64(ours.Nanoseconds())/n, "lock-ns")
	b.ReportMetric(float64(rt.Nanoseconds())/n, "rt-ns")
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
// contended harness (internal/bench). memcached cannot notify, so waiters
// poll; the round trip is a get on the first client, during the run.
func BenchmarkContended(b *testing.B) {
	testenv.Require(b, testenv.MemcacheAddr())
	ns := "mctest-" + randHex(4)
	run := bench.Contend{Hold: time.Millisecond, Acquisitions: b.N, RoundTripOp: "get"}
	for i := range 2 {
		mc := memcache.New(testenv.MemcacheAddr())
		b.Cleanup(func() { mc.Close() })
		c, err := locker.New(mustNew(b, mc), locker.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		if i == 0 {
			run.RoundTrip = func(context.Context) error {
				if _, err := mc.Get(ns + "-rtt"); err != nil && err != memcache.ErrCacheMiss {
					return err
				}
				return nil
			}
		}
		for range 4 {
			run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, "contended")})
		}
	}
	run.RunB(b).Summary().Report(b, "")
}
