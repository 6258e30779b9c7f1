package redislock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// callCounter is a go-redis hook that counts the round trips that ran
// scripts (a command sent alone, or a pipeline) and the scripts they ran.
// Connection set-up (HELLO, CLIENT SETINFO) and other commands are not
// counted.
type callCounter struct {
	calls, cmds atomic.Int64
}

func isScript(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval"
}

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			c.calls.Add(1)
			c.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if isScript(cmd) {
				n++
			}
		}
		if n > 0 {
			c.calls.Add(1)
			c.cmds.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

// countedClient is a client of addr whose round trips c counts, set up as
// OpenQuorum sets up a quorum member (no retries: a server is one vote).
func countedClient(t *testing.T, addr string, c *callCounter) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	rdb.AddHook(c)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

const (
	scaleLocks = 5000
	// A TTL of 3 s leaves a refresh round of 5,000 locks (up to 0.6 s on a
	// loaded 2-core machine under -race) well inside each lock's TTL/3;
	// with 1 s, a busy machine lost locks.
	scaleTTL  = 3 * time.Second
	scaleHold = 6 * time.Second // six refresh periods (TTL/3)
	// scaleWorkers acquire (and release) the locks.
	scaleWorkers = 8
)

// Holding many automatically refreshed locks costs goroutines and round
// trips in proportion to batches, not locks: 5,000 locks with a 3 s TTL,
// held for six refresh periods, on one server and on a five-server quorum
// (private servers), add fewer than 200 goroutines, none is lost, and each
// server sees on average many refreshes per round trip.
func TestRefreshScales(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		testenv.Require(t, testenv.RedisAddr())
		c := &callCounter{}
		d := mustNew(t, countedClient(t, testenv.RedisAddr(), c))
		testRefreshScales(t, d, []string{testenv.RedisAddr()}, []*callCounter{c})
	})
	t.Run("quorum", func(t *testing.T) {
		_, addrs := privateQuorum(t)
		var clients []redis.UniversalClient
		var counters []*callCounter
		for _, a := range addrs {
			c := &callCounter{}
			clients = append(clients, countedClient(t, a, c))
			counters = append(counters, c)
		}
		q, err := NewQuorum(clients)
		if err != nil {
			t.Fatal(err)
		}
		testRefreshScales(t, q, addrs, counters)
	})
}

// timedBatch times a driver's RefreshMany calls.
type timedBatch struct {
	batchDriver
	mu    sync.Mutex
	worst time.Duration
	calls int
}

type batchDriver interface {
	backend.Driver
	backend.BatchRefresher
}

func (d *timedBatch) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	start := time.Now()
	errs := d.batchDriver.RefreshMany(ctx, locks)
	took := time.Since(start)
	d.mu.Lock()
	d.worst = max(d.worst, took)
	d.calls++
	d.mu.Unlock()
	return errs
}

func testRefreshScales(t *testing.T, d backend.Driver, addrs []string, counters []*callCounter) {
	ctx := testCtx(t)
	drv := &timedBatch{}
	var use backend.Driver = d
	if bd, ok := d.(batchDriver); ok {
		drv.batchDriver = bd
		use = drv
	}
	ns := "redislock-scale-" + randHex(4)
	c, err := locker.New(use, locker.WithNamespace(ns), locker.WithDefaultTTL(scaleTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Warm up: connections, scripts.
	if l, err := c.TryAcquire(ctx, "warm-up"); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	g0 := runtime.NumGoroutine()

	locks := make([]*locker.Lock, scaleLocks)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range scaleWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= scaleLocks || ctx.Err() != nil {
					return
				}
				l, err := c.TryAcquire(ctx, fmt.Sprintf("held-%d", i))
				if err != nil {
					t.Errorf("TryAcquire %d: %v", i, err)
					return
				}
				locks[i] = l
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	acquired := time.Since(start)
	lostAcq := 0
	for _, l := range locks {
		if l.Err() != nil {
			lostAcq++
		}
	}

	// Hold them, sampling the goroutines and counting the round trips.
	calls0, cmds0 := make([]int64, len(counters)), make([]int64, len(counters))
	for i, cc := range counters {
		calls0[i], cmds0[i] = cc.calls.Load(), cc.cmds.Load()
	}
	peak := 0
	tick := time.NewTicker(10 * time.Millisecond)
	for end := time.Now().Add(scaleHold); time.Now().Before(end); {
		<-tick.C
		peak = max(peak, runtime.NumGoroutine()-g0)
	}
	tick.Stop()
	lost := 0
	for _, l := range locks {
		if l.Err() != nil {
			if lost == 0 {
				t.Errorf("lost: %v", l.Err())
			}
			lost++
		}
	}
	var perServer []string
	worst := 0.0
	for i, cc := range counters {
		calls, cmds := cc.calls.Load()-calls0[i], cc.cmds.Load()-cmds0[i]
		ratio := float64(cmds) / float64(max(calls, 1))
		if i == 0 || ratio < worst {
			worst = ratio
		}
		perServer = append(perServer, fmt.Sprintf("%d refreshes in %d round trips (%.0f per trip)", cmds, calls, ratio))
		// Every lock refreshed at least every TTL/3 (less its early
		// window), so at least hold/(TTL/3) times.
		if min := int64(scaleLocks) * int64(scaleHold/(scaleTTL/3)) * 8 / 10; cmds < min {
			t.Errorf("server %d: %d refreshes in %v, want at least %d", i+1, cmds, scaleHold, min)
		}
	}
	drv.mu.Lock()
	slowest, batches := drv.worst, drv.calls
	drv.mu.Unlock()
	t.Logf("%d locks acquired in %v (%d lost meanwhile); held %v: goroutines +%d at most (baseline %d), %d lost; %d RefreshMany calls, the slowest %v; per server: %v",
		scaleLocks, acquired.Round(time.Millisecond), lostAcq, scaleHold, peak, g0, lost, batches, slowest.Round(time.Millisecond), perServer)
	if peak >= 200 {
		t.Errorf("holding %d locks took %d goroutines above the baseline, want fewer than 200", scaleLocks, peak)
	}
	if lost > 0 {
		t.Errorf("%d of %d locks lost", lost, scaleLocks)
	}
	if worst < 20 {
		t.Errorf("%.1f refreshes per round trip on some server, want at least 20 (batches, not locks)", worst)
	}

	// The servers agree: each lock is held for its token on a majority.
	held := make([]int, scaleLocks)
	for _, a := range addrs {
		rdb := adminClient(t, a)
		gets := make([]*redis.StringCmd, scaleLocks)
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, l := range locks {
				gets[i] = p.Get(ctx, keysFor(backend.Key(ns, l.Name())).lock)
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			t.Logf("%s: %v (counted as not holding)", a, err)
		}
		for i, g := range gets {
			if v, err := g.Result(); err == nil && strings.HasPrefix(v, string(locks[i].Token())+".") {
				held[i]++
			}
		}
	}
	short := 0
	for i, n := range held {
		if n <= len(addrs)/2 && locks[i].Err() == nil {
			short++
		}
	}
	if short > 0 {
		t.Errorf("%d locks held by the Client are held on no majority of the servers", short)
	}
	next.Store(0)
	for range scaleWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= scaleLocks {
					return
				}
				// Clean-up only: what is not released expires.
				_ = locks[i].Release(ctx)
			}
		})
	}
	wg.Wait()
}
