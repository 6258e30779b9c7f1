package peers

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/redislock"
)

// BenchmarkRedisParallel: runParallel's 16 goroutines through one client,
// three ways: bsm/redislock, this project's Client over the default Driver,
// and the raw floor (SET NX PX + compare-and-delete). Names are "reused"
// (one per goroutine) or "fresh" (a new one every cycle: no fence counter
// yet). Around each block it reads the server's CPU (INFO cpu) and
// commands (INFO commandstats): the server's CPU per cycle, over
// bsm/redislock's per round, and its commands per cycle, logged. The CPU
// is the whole server's: point LOCKER_REDIS_ADDR at a server nothing else
// uses.
func BenchmarkRedisParallel(b *testing.B) {
	addr := testenv.RedisAddr()
	testenv.Require(b, addr)
	for _, fresh := range []bool{false, true} {
		mode := "reused"
		if fresh {
			mode = "fresh"
		}
		b.Run(mode, func(b *testing.B) { benchRedisParallel(b, addr, fresh) })
	}
}

func benchRedisParallel(b *testing.B, addr string, fresh bool) {
	newRDB := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2 * parallelGoroutines})
		b.Cleanup(func() { rdb.Close() })
		return rdb
	}
	stats := newRDB()
	d, err := redislock.New(newRDB(), redislock.WithRetention(2*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("peers-par"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	floorD, err := redislock.New(newRDB())
	if err != nil {
		b.Fatal(err)
	}
	floor, _ := measure.RawFloor(floorD)
	peer := bsm.New(newRDB())
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	var seq atomic.Uint64
	name := func(g int) string {
		if fresh {
			return id + "-" + strconv.Itoa(g) + "-" + strconv.FormatUint(seq.Add(1), 36)
		}
		return id + "-" + strconv.Itoa(g)
	}
	runParallel(b, func(ctx context.Context) (map[string]float64, error) { return redisCounters(ctx, stats) },
		parallelSubject{"bsm", func(ctx context.Context, g int) error {
			l, err := peer.Obtain(ctx, "peers-par-bsm-"+name(g), 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		parallelSubject{"locker", func(ctx context.Context, g int) error { return clientCycle(ctx, c, name(g)) }},
		parallelSubject{"raw", func(ctx context.Context, g int) error { return floor(ctx, "peers-par-raw-"+name(g)) }},
	)
}

// redisCounters reads INFO cpu and commandstats: "cpu_us" (user and
// system), and each command's "<command> calls" and "<command> µs".
func redisCounters(ctx context.Context, rdb *redis.Client) (map[string]float64, error) {
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			m["cpu_us"] += f * 1e6
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			for field := range strings.SplitSeq(v, ",") {
				fk, fv, _ := strings.Cut(field, "=")
				f, _ := strconv.ParseFloat(fv, 64)
				switch fk {
				case "calls":
					m[k[len("cmdstat_"):]+" calls"] = f
				case "usec":
					m[k[len("cmdstat_"):]+" µs"] = f
				}
			}
		}
	}
	return m, nil
}
