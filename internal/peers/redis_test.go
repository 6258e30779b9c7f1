package peers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/redislock"
)

// bsmBackoffs are the retry strategies bsm/redislock's users pick: its
// README's linear backoff, at a few milliseconds.
var bsmBackoffs = []time.Duration{2 * time.Millisecond, 8 * time.Millisecond}

// BenchmarkRedisContended: 8 workers on one name over 2 clients (each its
// own go-redis client), each holding the lock 1 ms, through internal/bench's
// Contend: this project's default Driver (through a locker.Client per go-redis
// client) against bsm/redislock with linear backoff, on the same server.
// The contenders alternate, round by round; each reports its merged
// samples, and "vs-bsm-<backoff>" is the median over rounds of this
// project's acquisitions per second over the peer's in the same round.
func BenchmarkRedisContended(b *testing.B) {
	addr := testenv.RedisAddr()
	testenv.Require(b, addr)
	ctx := context.Background()
	const workers, clients, rounds = 8, 2, 5
	perRound := max(b.N/rounds, 50)
	newRDB := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { rdb.Close() })
		return rdb
	}
	ours := func(name string) bench.Contend {
		run := bench.Contend{Hold: time.Millisecond, Acquisitions: perRound, RoundTripOp: "PING"}
		for i := range clients {
			rdb := newRDB()
			if i == 0 {
				run.RoundTrip = func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
			}
			d, err := redislock.New(rdb, redislock.WithRetention(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			c, err := locker.New(d, locker.WithNamespace("peers-bench"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			for range workers / clients {
				run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, name)})
			}
		}
		return run
	}
	peer := func(name string, backoff time.Duration) bench.Contend {
		run := bench.Contend{Hold: time.Millisecond, Acquisitions: perRound, RoundTripOp: "PING"}
		for i := range clients {
			rdb := newRDB()
			if i == 0 {
				run.RoundTrip = func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
			}
			c := bsm.New(rdb)
			opt := &bsm.Options{RetryStrategy: bsm.LinearBackoff(backoff)}
			for range workers / clients {
				run.Workers = append(run.Workers, bench.Worker{Client: i, Acquire: func(ctx context.Context) (func(context.Context) error, error) {
					l, err := c.Obtain(ctx, name, 30*time.Second, opt)
					if err != nil {
						return nil, err
					}
					return l.Release, nil
				}})
			}
		}
		return run
	}
	id := fmt.Sprintf("%x", time.Now().UnixNano())
	runs := []bench.Contend{ours("contended-" + id)}
	labels := []string{"locker"}
	for _, bo := range bsmBackoffs {
		runs = append(runs, peer("peers-bench-bsm-"+id+"-"+bo.String(), bo))
		labels = append(labels, "bsm-"+bo.String())
	}
	// Warm up: connections, scripts, subscriptions.
	for _, r := range runs {
		w := r
		w.Acquisitions = 20
		if _, err := w.Run(ctx); err != nil {
			b.Fatal(err)
		}
	}
	merged := make([]*bench.Samples, len(runs))
	ratios := make([][]float64, len(runs))
	b.ResetTimer()
	for round := range rounds {
		got := make([]float64, len(runs))
		for j := range runs {
			k := (round + j) % len(runs) // rotate who goes first
			s, err := runs[k].Run(ctx)
			if err != nil {
				b.Fatal(err)
			}
			got[k] = s.Summary().AcquisitionsSec
			if merged[k] == nil {
				merged[k] = s
			} else {
				merged[k].Add(s)
			}
		}
		for k := 1; k < len(runs); k++ {
			ratios[k] = append(ratios[k], got[0]/got[k])
		}
	}
	b.StopTimer()
	for k, s := range merged {
		s.Summary().Report(b, labels[k])
	}
	for k := 1; k < len(runs); k++ {
		med, lo, hi := medianRange(ratios[k])
		b.ReportMetric(med, "vs-"+labels[k])
		b.Logf("locker/%s acq/s per round: median %.2f, range %.2f–%.2f, %d rounds", labels[k], med, lo, hi, len(ratios[k]))
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRedisUncontended: one worker takes and releases a free lock on
// one go-redis client, in alternating blocks of a few operations, three
// ways: the raw floor (SET NX PX + compare-and-delete: measure.RawFloor),
// this project's default (locker.Client Acquire + Release, and the
// Driver's own Acquire + Release without the locker package) and
// bsm/redislock (Obtain + Release). It reports each one's µs per
// operation and the median and range over rounds of each over the floor.
func BenchmarkRedisUncontended(b *testing.B) {
	addr := testenv.RedisAddr()
	testenv.Require(b, addr)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	d, err := redislock.New(rdb, redislock.WithRetention(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("peers-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	peer := bsm.New(rdb)
	id := fmt.Sprintf("%x", time.Now().UnixNano())
	rawKey, name, bsmKey := "peers-bench-raw-"+id, "uncontended-"+id, "peers-bench-bsm-"+id
	drvKey, token := backend.Key("peers-bench", "driver-"+id), "peers-bench-token-"+id
	floor, _ := measure.RawFloor(d)
	fns := []func() error{
		func() error { return floor(ctx, rawKey) },
		func() error {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		func() error {
			cl := backend.Claim{Key: drvKey, Token: token, TTL: 30 * time.Second}
			if _, err := d.TryAcquire(ctx, cl); err != nil {
				return err
			}
			return d.Release(ctx, cl)
		},
		func() error {
			l, err := peer.Obtain(ctx, bsmKey, 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
	}
	labels := []string{"raw", "locker", "driver", "bsm"}
	const rounds, block = 7, 25
	for range 100 { // warm up
		for _, f := range fns {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
	}
	perRound := max(b.N/rounds, block)
	sums := make([]time.Duration, len(fns))
	ratios := make([][]float64, len(fns))
	b.ResetTimer()
	for range rounds {
		rs := make([]time.Duration, len(fns))
		for i := 0; i < perRound; i += block {
			for j := range fns {
				k := (i/block + j) % len(fns) // rotate the order of the blocks
				t := time.Now()
				for range block {
					if err := fns[k](); err != nil {
						b.Fatal(err)
					}
				}
				rs[k] += time.Since(t)
			}
		}
		for k := range fns {
			sums[k] += rs[k]
			if k > 0 {
				ratios[k] = append(ratios[k], float64(rs[k])/float64(rs[0]))
			}
		}
	}
	b.StopTimer()
	ops := float64(rounds * ((perRound + block - 1) / block) * block)
	for k := range fns {
		b.ReportMetric(float64(sums[k].Microseconds())/ops, labels[k]+"-µs")
	}
	for k := 1; k < len(fns); k++ {
		med, lo, hi := medianRange(ratios[k])
		b.ReportMetric(med, labels[k]+"/raw")
		b.Logf("%s/raw: median %.3f, range %.3f–%.3f, %d rounds of %d ops", labels[k], med, lo, hi, len(ratios[k]), perRound)
	}
	b.ReportMetric(0, "ns/op")
}

func medianRange(xs []float64) (med, lo, hi float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0, 0, 0
	}
	return s[len(s)/2], s[0], s[len(s)-1]
}
