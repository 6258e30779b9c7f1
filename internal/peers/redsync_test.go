package peers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/redislock"
)

// Redlock over the five quorum servers: redsync v4 (goredis/v9 pools, one
// go-redis client per server) against this project's Quorum through a
// locker.Client, in the same run, in alternating blocks.
//
//	cd internal/peers && go test -run '^$' -bench Redsync -benchtime 2000x

func randName() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// redsyncOn returns a redsync over its own go-redis clients, one per
// server, closed at the end of the benchmark.
func redsyncOn(b *testing.B, addrs []string) *redsync.Redsync {
	var pools []redsyncredis.Pool
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		b.Cleanup(func() { c.Close() })
		pools = append(pools, goredis.NewPool(c))
	}
	return redsync.New(pools...)
}

// quorumClient is a locker.Client over a Quorum of its own.
func quorumClient(b *testing.B, addrs []string) (*locker.Client, *redislock.Quorum) {
	q, err := redislock.OpenQuorum(context.Background(), "redis+quorum://"+strings.Join(addrs, ",")+"/0")
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(q, locker.WithNamespace("peers-redsync"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c, q
}

// spread reports the median and range of xs under name.
func spread(b *testing.B, name string, xs []float64) {
	s := slices.Sorted(slices.Values(xs))
	b.ReportMetric(s[len(s)/2], name)
	b.ReportMetric(s[0], name+"-min")
	b.ReportMetric(s[len(s)-1], name+"-max")
}

// BenchmarkRedsyncUncontended: one worker acquires and releases a new name
// per operation, in blocks of 50 operations per subject, rotated each
// round:
//
//	redsync  Mutex.LockContext + UnlockContext (defaults: 8s expiry, waits for all five)
//	locker   Client.Acquire + Lock.Release over a Quorum (TTL 8s, as redsync's)
//	raw      the Quorum's raw floor: SET NX PX + compare-and-delete, each at the first majority
//
// Reported: ops/s of each (total), the median and range over rounds of
// locker/redsync and locker/raw (time ratios: below 1 is faster).
func BenchmarkRedsyncUncontended(b *testing.B) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(b, addrs...)
	ctx := context.Background()
	rs := redsyncOn(b, addrs)
	c, q := quorumClient(b, addrs)
	prefix := "peers-redsync-u-" + randName() + "-"
	seq := 0
	next := func() string { seq++; return prefix + strconv.Itoa(seq) }
	floor, _ := measure.RawFloor(q)
	fns := []func(){
		func() {
			m := rs.NewMutex(next())
			if err := m.LockContext(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := m.UnlockContext(ctx); err != nil {
				b.Fatal(err)
			}
		},
		func() {
			l, err := c.Acquire(ctx, next(), locker.TTL(8*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		},
		func() {
			if err := floor(ctx, next()); err != nil {
				b.Fatal(err)
			}
		},
	}
	names := []string{"redsync", "locker", "raw"}
	for range 50 {
		for _, f := range fns {
			f()
		}
	}
	const block = 50
	sums := make([]time.Duration, len(fns))
	var vsPeer, vsRaw []float64
	b.ResetTimer()
	for round := 0; round*block < b.N; round++ {
		var r [3]time.Duration
		for j := range fns {
			k := (round + j) % len(fns)
			t := time.Now()
			for range block {
				fns[k]()
			}
			r[k] = time.Since(t)
			sums[k] += r[k]
		}
		vsPeer = append(vsPeer, float64(r[1])/float64(r[0]))
		vsRaw = append(vsRaw, float64(r[1])/float64(r[2]))
	}
	b.StopTimer()
	ops := float64(len(vsPeer) * block)
	for k, n := range names {
		b.ReportMetric(ops/sums[k].Seconds(), n+"-ops/s")
	}
	spread(b, "locker/redsync", vsPeer)
	spread(b, "locker/raw", vsRaw)
	b.ReportMetric(float64(len(vsPeer)), "rounds")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRedsyncContended: 8 workers on 2 clients take one name in turn,
// each holding it 1 ms, through internal/bench's Contend harness; the
// subjects alternate in blocks of 100 acquisitions (b.N in all per
// subject), each block on a new name:
//
//	redsync        redsync's defaults: 32 tries, random 50-250 ms between them
//	redsync-tuned  retry delay random 1-5 ms, 2000 tries (about as long a wait)
//	locker         Client.Acquire over a Quorum (release notifications)
//
// Each client is a redsync, or a Quorum and its locker.Client, of its own
// (five go-redis clients). Reported per subject: acq/s, handoff and wait
// percentiles, fairness, retakes (bench.Contention.Report), and the median
// and range over blocks of locker's acq/s over each redsync's.
func BenchmarkRedsyncContended(b *testing.B) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(b, addrs...)
	const workers, clients, block = 8, 2, 100
	tuned := []redsync.Option{
		redsync.WithTries(2000),
		redsync.WithRetryDelayFunc(func(int) time.Duration { return time.Millisecond + mrand.N(4*time.Millisecond) }),
	}
	type subject struct {
		name string
		make func(name string) []bench.Worker
		all  *bench.Samples
		rate []float64
	}
	redsyncWorkers := func(opts []redsync.Option) func(string) []bench.Worker {
		var rss []*redsync.Redsync
		for range clients {
			rss = append(rss, redsyncOn(b, addrs))
		}
		return func(name string) []bench.Worker {
			var ws []bench.Worker
			for i := range workers {
				rs := rss[i%clients]
				ws = append(ws, bench.Worker{Client: i % clients, Acquire: func(ctx context.Context) (func(context.Context) error, error) {
					m := rs.NewMutex(name, opts...)
					if err := m.LockContext(ctx); err != nil {
						return nil, err
					}
					return func(ctx context.Context) error {
						_, err := m.UnlockContext(ctx)
						return err
					}, nil
				}})
			}
			return ws
		}
	}
	var lcs []*locker.Client
	for range clients {
		c, _ := quorumClient(b, addrs)
		lcs = append(lcs, c)
	}
	subjects := []*subject{
		{name: "redsync", make: redsyncWorkers(nil)},
		{name: "redsync-tuned", make: redsyncWorkers(tuned)},
		{name: "locker", make: func(name string) []bench.Worker {
			var ws []bench.Worker
			for i := range workers {
				ws = append(ws, bench.Worker{Client: i % clients, Acquire: bench.ClientAcquirer(lcs[i%clients], name)})
			}
			return ws
		}},
	}
	prefix := "peers-redsync-c-" + randName() + "-"
	ctx := context.Background()
	b.ResetTimer()
	for round := 0; round*block < b.N; round++ {
		for j := range subjects {
			s := subjects[(round+j)%len(subjects)]
			name := fmt.Sprintf("%s%s-%d", prefix, s.name, round)
			run := bench.Contend{Workers: s.make(name), Hold: time.Millisecond, Acquisitions: block}
			got, err := run.Run(ctx)
			if err != nil {
				b.Fatal(s.name, ": ", err)
			}
			s.rate = append(s.rate, float64(got.Acquisitions)/got.Elapsed.Seconds())
			if s.all == nil {
				s.all = got
			} else {
				s.all.Add(got)
			}
		}
	}
	b.StopTimer()
	for _, s := range subjects {
		s.all.Summary().Report(b, s.name)
	}
	for _, peer := range subjects[:2] {
		var r []float64
		for i := range peer.rate {
			r = append(r, subjects[2].rate[i]/peer.rate[i])
		}
		spread(b, "locker/"+peer.name+"-acq/s", r)
	}
	b.ReportMetric(0, "ns/op")
}
