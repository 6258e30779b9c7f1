package redislock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkUncontended measures one acquire+release of a free lock, four
// ways, interleaved in one run on one go-redis client, and reports each
// against the raw floor:
//
//	raw      SET NX PX + EVALSHA compare-and-delete
//	driver   Driver.TryAcquire + Driver.Release (acquire script with the fence, release script with PUBLISH)
//	try      locker.Client.TryAcquire + Lock.Release (adds the portable layer: token, watchdog, bookkeeping)
//	acquire  locker.Client.Acquire + Lock.Release (adds the release subscription of a blocking acquire)
//	fair-try, fair-acquire  the same two over a FairDriver (scripts that also look at the queue)
//	legacy-acquire  acquire as the default mode did before it queued waiters (see legacyDriver)
//	driver-acquire  Driver.Enqueue + Driver.Release (the blocking path, without the locker package)
//	driver-legacy   Driver.TryAcquire + the former release script (DEL + PUBLISH, no look at the queue)
func BenchmarkUncontended(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	d := mustNew(b, rdb)
	c, err := locker.New(mustNew(b, rdb), locker.WithNamespace("redislock-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	defer d.Close()
	fc, err := locker.New(mustNewFair(b, rdb), locker.WithNamespace("redislock-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer fc.Close()
	lc, err := locker.New(legacyDriver{d}, locker.WithNamespace("redislock-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer lc.Close()
	rawKey := "redislock-bench-raw-" + randHex(4)
	key := backend.Key("redislock-bench", "driver-"+randHex(4))
	name := "client-" + randHex(4)
	token := newToken()
	// The raw floor (floor.go) on the same client; warmed up below.
	floor, _ := measure.RawFloor(d)
	raw := func() {
		if err := floor(ctx, rawKey); err != nil {
			b.Fatal(err)
		}
	}
	drv := func() {
		l := backend.Claim{Key: key, Token: token, TTL: 30 * time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	drvAcquire := func() {
		l := backend.Claim{Key: key, Token: token, TTL: 30 * time.Second}
		if _, err := queueAcquire(ctx, d, l); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	drvLegacy := func() {
		l := backend.Claim{Key: key, Token: token, TTL: 30 * time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		if err := (legacyDriver{d}).Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	lockRelease := func(c *locker.Client, blocking bool) func() {
		acquire := c.TryAcquire
		if blocking {
			acquire = c.Acquire
		}
		return func() {
			l, err := acquire(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	fns := []func(){raw, drv, lockRelease(c, false), lockRelease(c, true), lockRelease(fc, false), lockRelease(fc, true), lockRelease(lc, true), drvAcquire, drvLegacy}
	for range 200 {
		for _, f := range fns {
			f()
		}
	}
	sums := make([]time.Duration, len(fns))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// Rotate the order so that none always follows the same one.
		for j := range fns {
			k := (i + j) % len(fns)
			t := time.Now()
			fns[k]()
			sums[k] += time.Since(t)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	b.ReportMetric(us(sums[0]), "raw-µs")
	b.ReportMetric(us(sums[1]), "driver-µs")
	b.ReportMetric(us(sums[2]), "try-µs")
	b.ReportMetric(us(sums[3]), "acquire-µs")
	b.ReportMetric(float64(sums[1])/float64(sums[0]), "driver/raw")
	b.ReportMetric(float64(sums[2])/float64(sums[0]), "try/raw")
	b.ReportMetric(float64(sums[3])/float64(sums[0]), "acquire/raw")
	b.ReportMetric(us(sums[4]), "fair-try-µs")
	b.ReportMetric(us(sums[5]), "fair-acquire-µs")
	b.ReportMetric(float64(sums[4])/float64(sums[0]), "fair-try/raw")
	b.ReportMetric(float64(sums[5])/float64(sums[0]), "fair-acquire/raw")
	b.ReportMetric(float64(sums[6])/float64(sums[0]), "legacy-acquire/raw")
	b.ReportMetric(float64(sums[3])/float64(sums[6]), "acquire/legacy")
	b.ReportMetric(float64(sums[7])/float64(sums[0]), "driver-acquire/raw")
	b.ReportMetric(float64(sums[8])/float64(sums[0]), "driver-legacy/raw")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkContended: 8 workers on 2 clients (each its own Driver and
// go-redis client) take one name in turn, each holding it 1ms, through the
// contended harness (internal/bench): handoff (from the holder calling
// Release to the next holder's Acquire returning) percentiles and over the
// round trip (PING on the drivers' own go-redis clients, during the run),
// wait p99, fairness, and how often the releasing worker took the lock
// again next (retake).
func BenchmarkContended(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	benchContended(b, func() (backend.Driver, redis.UniversalClient) {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		b.Cleanup(func() { rdb.Close() })
		return mustNew(b, rdb), rdb
	})
}

// BenchmarkContendedFair is the same with FairDrivers.
func BenchmarkContendedFair(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	benchContended(b, func() (backend.Driver, redis.UniversalClient) {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		b.Cleanup(func() { rdb.Close() })
		return mustNewFair(b, rdb), rdb
	})
}

// BenchmarkContendedQuorum is the same over the five quorum servers; the
// round trip is a PING to the first one, on a client of its own (the
// quorum driver keeps its clients to itself).
func BenchmarkContendedQuorum(b *testing.B) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(b, addrs...)
	benchContended(b, func() (backend.Driver, redis.UniversalClient) {
		q, err := OpenQuorum(context.Background(), "redis+quorum://"+strings.Join(addrs, ",")+"/0")
		if err != nil {
			b.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: addrs[0]})
		b.Cleanup(func() { rdb.Close() })
		return q, rdb
	})
}

// sharedDriver lets several locker.Clients use one driver: Close does
// nothing (the benchmark closes the driver itself).
type sharedDriver struct {
	backend.Driver
	backend.Notifier
}

func (sharedDriver) Close() error { return nil }

// sharedQueuer is sharedDriver for a driver with a queue in the store.
type sharedQueuer struct {
	backend.Driver
	backend.Queuer
}

func (sharedQueuer) Close() error { return nil }

// share wraps d for a locker.Client of its own, keeping the way it waits.
func share(d backend.Driver) backend.Driver {
	if q, ok := d.(backend.Queuer); ok {
		return sharedQueuer{d, q}
	}
	return sharedDriver{d, d.(backend.Notifier)}
}

// benchContended runs the workers over drivers that open returns, with the
// go-redis client to PING for the round trip.
func benchContended(b *testing.B, open func() (backend.Driver, redis.UniversalClient)) {
	// As specified: 2 locker.Clients, 4 workers each.
	b.Run("2-clients", func(b *testing.B) { benchContendedWith(b, open, false) })
	// The same 2 drivers (2 go-redis clients, 2 subscription hubs), but a
	// locker.Client per worker: the locker package then wakes no waiter of
	// the same Client on release ahead of the others, and every waiter
	// learns of a release the same way, by pub/sub.
	b.Run("client-per-worker", func(b *testing.B) { benchContendedWith(b, open, true) })
}

func benchContendedWith(b *testing.B, open func() (backend.Driver, redis.UniversalClient), perWorker bool) {
	ctx := context.Background()
	const workers, clients = 8, 2
	ns := "redislock-bench"
	name := "contended-" + randHex(4)
	run := bench.Contend{Hold: time.Millisecond, Acquisitions: b.N, RoundTripOp: "PING"}
	for i := range clients {
		d, rdb := open()
		if i == 0 {
			run.RoundTrip = func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
		}
		var shared *locker.Client
		if perWorker {
			b.Cleanup(func() { d.Close() })
		} else {
			shared = benchClientOn(b, d, ns)
		}
		for range workers / clients {
			c := shared
			if perWorker {
				c = benchClientOn(b, share(d), ns)
			}
			// Warm up the client's connections and subscription.
			l, err := c.Acquire(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			l.Release(ctx)
			run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, name)})
		}
	}
	run.RunB(b).Summary().Report(b, "")
	b.ReportMetric(0, "ns/op")
}

func benchClientOn(b *testing.B, d backend.Driver, ns string) *locker.Client {
	c, err := locker.New(d, locker.WithNamespace(ns))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// legacyDriver is the default mode as it was before it queued waiters, for
// comparison in the same run: a Notifier (the locker package polls and is
// woken by pub/sub), whose release only deletes and publishes.
type legacyDriver struct{ d *Driver }

func (l legacyDriver) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	return l.d.TryAcquire(ctx, c)
}

func (l legacyDriver) Refresh(ctx context.Context, c backend.Claim) error { return l.d.Refresh(ctx, c) }

func (l legacyDriver) Release(ctx context.Context, c backend.Claim) error {
	ok, err := l.d.dep.release(ctx, c)
	if err != nil {
		return err
	}
	if !ok {
		return backend.ErrNotHeld
	}
	return nil
}

func (l legacyDriver) Close() error { return nil }

func (l legacyDriver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return l.d.Subscribe(ctx, key)
}

// BenchmarkCycle runs one uncontended acquire+release alone, for profiles
// and allocs/op: the raw floor, the Driver, and a locker.Client over a
// Driver on a given go-redis client and over one that Open dialed
// (interruptible connections, contexts watched).
func BenchmarkCycle(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	d := mustNew(b, rdb)
	defer d.Close()
	c := benchClientOn(b, mustNew(b, rdb), "redislock-bench")
	od, err := Open(ctx, "redis://"+testenv.RedisAddr())
	if err != nil {
		b.Fatal(err)
	}
	oc := benchClientOn(b, od, "redislock-bench")
	floor, _ := measure.RawFloor(d)
	key := backend.Key("redislock-bench", "cycle-"+randHex(4))
	token := newToken()
	name := "cycle-" + randHex(4)
	cycle := func(c *locker.Client) func() error {
		return func() error {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	for _, s := range []struct {
		name string
		op   func() error
	}{
		{"raw", func() error { return floor(ctx, key) }},
		{"driver", func() error {
			cl := backend.Claim{Key: key, Token: token, TTL: 30 * time.Second}
			if _, err := d.TryAcquire(ctx, cl); err != nil {
				return err
			}
			return d.Release(ctx, cl)
		}},
		{"client", cycle(c)},
		{"client-open", cycle(oc)},
	} {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := s.op(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
