package peers

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/redislock"
)

// BenchmarkRedisParallel: 16 goroutines, each on names of its own, take and
// release a free lock through one client, three ways in interleaved
// rounds: the raw floor (SET NX PX + compare-and-delete), this project's
// Client over the default Driver, and bsm/redislock. Names are "reused"
// (one per goroutine) or "fresh" (a new one every cycle: no fence counter
// yet). Each round runs every contender for a block of PEERS_BLOCK (500ms)
// and reads, around the block, the process's CPU (getrusage) and the
// server's (INFO cpu) and commands (INFO commandstats). It reports the
// medians over rounds of each one's cycles/s and client and server CPU µs
// per cycle, the median and range of locker over bsm per round, and logs
// the server's commands per cycle. The server's CPU is the whole server's:
// point LOCKER_REDIS_ADDR at a server nothing else uses.
func BenchmarkRedisParallel(b *testing.B) {
	addr := testenv.RedisAddr()
	testenv.Require(b, addr)
	for _, fresh := range []bool{false, true} {
		mode := "reused"
		if fresh {
			mode = "fresh"
		}
		b.Run(mode, func(b *testing.B) { benchParallel(b, addr, fresh) })
	}
}

const parallelWorkers = 16

// redisParallelBlock is how long a contender runs in each round.
func redisParallelBlock() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("PEERS_BLOCK")); err == nil {
		return d
	}
	return 500 * time.Millisecond
}

// cycler runs one lock cycle on a name.
type cycler func(ctx context.Context, name string) error

func benchParallel(b *testing.B, addr string, fresh bool) {
	ctx := context.Background()
	newRDB := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2 * parallelWorkers})
		b.Cleanup(func() { rdb.Close() })
		return rdb
	}
	stats := newRDB()
	ourRDB := newRDB()
	d, err := redislock.New(ourRDB, redislock.WithRetention(2*time.Second))
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
	labels := []string{"raw", "locker", "bsm"}
	cyclers := []cycler{
		func(ctx context.Context, name string) error { return floor(ctx, "peers-par-raw-"+name) },
		func(ctx context.Context, name string) error {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		func(ctx context.Context, name string) error {
			l, err := peer.Obtain(ctx, "peers-par-bsm-"+name, 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
	}
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	var seq atomic.Uint64
	run := func(k int, dur time.Duration) (block, error) {
		before, err := readServer(ctx, stats)
		if err != nil {
			return block{}, err
		}
		cpu0, t0 := cpuTime(), time.Now()
		var n atomic.Int64
		var firstErr error
		var once sync.Once
		var wg sync.WaitGroup
		for g := range parallelWorkers {
			wg.Go(func() {
				name := id + "-" + strconv.Itoa(g)
				for time.Since(t0) < dur {
					nm := name
					if fresh {
						nm += "-" + strconv.FormatUint(seq.Add(1), 36)
					}
					if err := cyclers[k](ctx, nm); err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		wall, cpu := time.Since(t0), cpuTime()-cpu0
		after, err := readServer(ctx, stats)
		if err != nil {
			return block{}, err
		}
		if firstErr != nil {
			return block{}, fmt.Errorf("%s: %w", labels[k], firstErr)
		}
		return block{cycles: n.Load(), wall: wall, cpu: cpu, server: after.sub(before)}, nil
	}
	for k := range cyclers { // warm up: connections, scripts
		if _, err := run(k, 100*time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
	const rounds = 7
	dur := redisParallelBlock()
	per := make([][]block, len(cyclers))
	b.ResetTimer()
	for round := range rounds {
		for j := range cyclers {
			k := (round + j) % len(cyclers) // rotate who goes first
			bl, err := run(k, dur)
			if err != nil {
				b.Fatal(err)
			}
			per[k] = append(per[k], bl)
		}
	}
	b.StopTimer()
	for k, bs := range per {
		med, _, _ := medianRange(mapBlocks(bs, block.rate))
		b.ReportMetric(med, labels[k]+"-cycles/s")
		med, _, _ = medianRange(mapBlocks(bs, block.clientUs))
		b.ReportMetric(med, labels[k]+"-client-µs/cycle")
		med, _, _ = medianRange(mapBlocks(bs, block.serverUs))
		b.ReportMetric(med, labels[k]+"-server-µs/cycle")
		b.Logf("%s: server commands per cycle: %s", labels[k], commandsPerCycle(bs))
	}
	ours, theirs := per[1], per[2]
	for _, m := range []struct {
		name string
		f    func(block) float64
	}{{"cycles/s", block.rate}, {"client-CPU/cycle", block.clientUs}, {"server-CPU/cycle", block.serverUs}} {
		rs := make([]float64, rounds)
		for i := range rs {
			rs[i] = m.f(ours[i]) / m.f(theirs[i])
		}
		med, lo, hi := medianRange(rs)
		b.ReportMetric(med, "locker/bsm-"+m.name)
		b.Logf("locker/bsm %s per round: median %.2f, range %.2f–%.2f, %d rounds of %v", m.name, med, lo, hi, rounds, dur)
	}
	b.ReportMetric(0, "ns/op")
}

// block is what one contender did in one round.
type block struct {
	cycles    int64
	wall, cpu time.Duration
	server    serverStats
}

func (b block) rate() float64     { return float64(b.cycles) / b.wall.Seconds() }
func (b block) clientUs() float64 { return float64(b.cpu.Microseconds()) / float64(b.cycles) }
func (b block) serverUs() float64 { return b.server.cpuUs / float64(b.cycles) }

func mapBlocks(bs []block, f func(block) float64) []float64 {
	out := make([]float64, len(bs))
	for i, b := range bs {
		out[i] = f(b)
	}
	return out
}

// commandsPerCycle sums the blocks' commands and reports each one's calls
// and µs per cycle, the costliest first (the stats' own INFO left out).
func commandsPerCycle(bs []block) string {
	var cycles int64
	calls, usec := map[string]float64{}, map[string]float64{}
	for _, b := range bs {
		cycles += b.cycles
		for name, c := range b.server.cmds {
			calls[name] += c.calls
			usec[name] += c.usec
		}
	}
	names := make([]string, 0, len(calls))
	for name := range calls {
		if calls[name] > 0 {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(i, j int) bool { return usec[names[i]] > usec[names[j]] })
	var s strings.Builder
	for _, name := range names {
		fmt.Fprintf(&s, "%s %.2f×%.2fµs; ", name, calls[name]/float64(cycles), usec[name]/calls[name])
	}
	return s.String()
}

// serverStats is a server's CPU (µs, user and system) and its commands'
// calls and µs so far.
type serverStats struct {
	cpuUs float64
	cmds  map[string]cmdStat
}

type cmdStat struct{ calls, usec float64 }

func (s serverStats) sub(o serverStats) serverStats {
	d := serverStats{cpuUs: s.cpuUs - o.cpuUs, cmds: map[string]cmdStat{}}
	for name, c := range s.cmds {
		p := o.cmds[name]
		d.cmds[name] = cmdStat{c.calls - p.calls, c.usec - p.usec}
	}
	return d
}

// readServer reads INFO cpu and commandstats.
func readServer(ctx context.Context, rdb *redis.Client) (serverStats, error) {
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return serverStats{}, err
	}
	s := serverStats{cmds: map[string]cmdStat{}}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			s.cpuUs += f * 1e6
		case strings.HasPrefix(k, "cmdstat_"):
			var c cmdStat
			for field := range strings.SplitSeq(v, ",") {
				fk, fv, _ := strings.Cut(field, "=")
				f, _ := strconv.ParseFloat(fv, 64)
				switch fk {
				case "calls":
					c.calls = f
				case "usec":
					c.usec = f
				}
			}
			s.cmds[strings.TrimPrefix(k, "cmdstat_")] = c
		}
	}
	return s, nil
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
