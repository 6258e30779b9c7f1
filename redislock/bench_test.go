package redislock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// The raw floor: what a minimal Redis lock costs, one SET NX PX and one
// compare-and-delete script, on the same client.
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkUncontended measures one acquire+release of a free lock, four
// ways, interleaved in one run on one go-redis client, and reports each
// against the raw floor:
//
//	raw      SET NX PX + EVALSHA compare-and-delete
//	driver   Driver.TryAcquire + Driver.Release (acquire script with the fence, release script with PUBLISH)
//	try      locker.Client.TryAcquire + Lock.Release (adds the portable layer: token, watchdog, bookkeeping)
//	acquire  locker.Client.Acquire + Lock.Release (adds the release subscription of a blocking acquire)
//	fair-try, fair-acquire  the same two over a FairDriver (scripts that also look at the queue)
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
	rawKey := "redislock-bench-raw-" + randHex(4)
	key := backend.Key("redislock-bench", "driver-"+randHex(4))
	name := "client-" + randHex(4)
	token := newToken()
	// Warm up: scripts loaded, connections made, the subscription hub up.
	if err := rawRelease.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	raw := func() {
		if err := rdb.SetArgs(ctx, rawKey, token, redis.SetArgs{Mode: "NX", TTL: 30 * time.Second}).Err(); err != nil {
			b.Fatal(err)
		}
		if err := rawRelease.Run(ctx, rdb, []string{rawKey}, token).Err(); err != nil {
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
	fns := []func(){raw, drv, lockRelease(c, false), lockRelease(c, true), lockRelease(fc, false), lockRelease(fc, true)}
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
	b.ReportMetric(0, "ns/op")
}

// BenchmarkContended: 8 workers on 2 clients (each its own Driver and
// go-redis client) take one name in turn, each holding it 1ms. It reports
// the median handoff (from the holder calling Release to the next holder's
// Acquire returning) against the server's median round trip (PING on the
// same kind of client, measured in the same run), the 99th percentile of
// the time an Acquire waits, and how often the releasing worker took the
// lock again next.
func BenchmarkContended(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	benchContended(b, func() backend.Driver {
		d, err := Open(context.Background(), "redis://"+testenv.RedisAddr()+"/0")
		if err != nil {
			b.Fatal(err)
		}
		return d
	}, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()}) })
}

// BenchmarkContendedFair is the same with FairDrivers.
func BenchmarkContendedFair(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	benchContended(b, func() backend.Driver {
		d, err := OpenFair(context.Background(), "redis://"+testenv.RedisAddr()+"/0")
		if err != nil {
			b.Fatal(err)
		}
		return d
	}, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()}) })
}

// BenchmarkContendedQuorum is the same over the five quorum servers.
func BenchmarkContendedQuorum(b *testing.B) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(b, addrs...)
	benchContended(b, func() backend.Driver {
		q, err := OpenQuorum(context.Background(), "redis+quorum://"+joinAddrs(addrs)+"/0")
		if err != nil {
			b.Fatal(err)
		}
		return q
	}, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addrs[0]}) })
}

func joinAddrs(a []string) string {
	s := ""
	for i, x := range a {
		if i > 0 {
			s += ","
		}
		s += x
	}
	return s
}

type event struct {
	worker               int
	called, got, release time.Time
}

// sharedDriver lets several locker.Clients use one driver: Close does
// nothing (the benchmark closes the driver itself).
type sharedDriver struct {
	backend.Driver
	backend.Notifier
}

func (sharedDriver) Close() error { return nil }

// sharedWaiter is sharedDriver for a driver with a native queue.
type sharedWaiter struct {
	backend.Driver
	backend.Waiter
}

func (sharedWaiter) Close() error { return nil }

// share wraps d for a locker.Client of its own, keeping the way it waits.
func share(d backend.Driver) backend.Driver {
	if w, ok := d.(backend.Waiter); ok {
		return sharedWaiter{d, w}
	}
	return sharedDriver{d, d.(backend.Notifier)}
}

func benchContended(b *testing.B, open func() backend.Driver, pingClient func() redis.UniversalClient) {
	// As specified: 2 locker.Clients, 4 workers each.
	b.Run("2-clients", func(b *testing.B) { benchContendedWith(b, open, pingClient, false) })
	// The same 2 drivers (2 go-redis clients, 2 subscription hubs), but a
	// locker.Client per worker: the locker package then wakes no waiter of
	// the same Client on release ahead of the others (see the report), and
	// every waiter learns of a release the same way, by pub/sub.
	b.Run("client-per-worker", func(b *testing.B) { benchContendedWith(b, open, pingClient, true) })
}

func benchContendedWith(b *testing.B, open func() backend.Driver, pingClient func() redis.UniversalClient, perWorker bool) {
	ctx := context.Background()
	const workers, clients, hold = 8, 2, time.Millisecond
	ns := "redislock-bench"
	var cs []*locker.Client
	for range clients {
		d := open()
		if !perWorker {
			c, err := locker.New(d, locker.WithNamespace(ns))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cs = append(cs, c)
			continue
		}
		defer d.Close()
		for range workers / clients {
			c, err := locker.New(share(d), locker.WithNamespace(ns))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cs = append(cs, c)
		}
	}
	clientOf := func(w int) *locker.Client {
		if perWorker {
			return cs[(w%clients)*(workers/clients)+w/clients]
		}
		return cs[w%clients]
	}
	name := "contended-" + randHex(4)
	// Warm up each client's connections and subscription.
	for _, c := range cs {
		l, err := c.Acquire(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(ctx)
	}
	rtt := medianRTT(b, pingClient())
	// The round trip again, while the workers run: the same machine, as
	// busy as the handoffs see it.
	pinger := pingClient()
	stopPing := make(chan struct{})
	var busyRTTs []time.Duration
	var pingWG sync.WaitGroup
	pingWG.Go(func() {
		defer pinger.Close()
		for {
			select {
			case <-stopPing:
				return
			default:
			}
			t := time.Now()
			if err := pinger.Ping(ctx).Err(); err != nil {
				b.Error(err)
				return
			}
			busyRTTs = append(busyRTTs, time.Since(t))
			time.Sleep(time.Millisecond)
		}
	})

	total := b.N
	events := make([]event, 0, total+workers)
	var mu sync.Mutex
	var taken atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range workers {
		wg.Go(func() {
			c := clientOf(w)
			for taken.Add(1) <= int64(total) {
				e := event{worker: w, called: time.Now()}
				l, err := c.Acquire(ctx, name)
				if err != nil {
					b.Error(err)
					return
				}
				e.got = time.Now()
				time.Sleep(hold)
				e.release = time.Now()
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(stopPing)
	pingWG.Wait()
	slices.SortFunc(events, func(x, y event) int { return x.got.Compare(y.got) })
	var handoffs, waits []time.Duration
	retakes, sameClient := 0, 0
	for i, e := range events {
		waits = append(waits, e.got.Sub(e.called))
		if i == 0 {
			continue
		}
		prev := events[i-1]
		handoffs = append(handoffs, e.got.Sub(prev.release))
		if e.worker == prev.worker {
			retakes++
		}
		if e.worker%clients == prev.worker%clients {
			sameClient++
		}
	}
	if len(handoffs) == 0 {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	h := percentile(handoffs, 50)
	b.ReportMetric(float64(h.Microseconds()), "handoff-p50-µs")
	b.ReportMetric(float64(rtt.Microseconds()), "rtt-p50-µs")
	b.ReportMetric(float64(h)/float64(rtt), "handoff/rtt")
	if len(busyRTTs) > 0 {
		busy := percentile(busyRTTs, 50)
		b.ReportMetric(float64(busy.Microseconds()), "busy-rtt-p50-µs")
		b.ReportMetric(float64(h)/float64(busy), "handoff/busy-rtt")
	}
	b.ReportMetric(ms(percentile(waits, 99)), "wait-p99-ms")
	b.ReportMetric(ms(percentile(waits, 50)), "wait-p50-ms")
	b.ReportMetric(100*float64(retakes)/float64(len(handoffs)), "retake-%")
	b.ReportMetric(100*float64(sameClient)/float64(len(handoffs)), "same-client-%")
	b.ReportMetric(0, "ns/op")
}

func medianRTT(b *testing.B, rdb redis.UniversalClient) time.Duration {
	defer rdb.Close()
	ctx := context.Background()
	var ds []time.Duration
	for range 500 {
		t := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t))
	}
	return percentile(ds, 50)
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[min(i, len(s)-1)]
}
