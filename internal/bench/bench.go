// Package bench runs the workloads of `lockctl bench` against one backend:
// uncontended acquire+release, parallel acquire+release on distinct names,
// N workers contending for one name across M clients, and K locks held with
// automatic refresh.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// Config sizes the workloads. Zero fields take the defaults of Defaults.
type Config struct {
	Duration time.Duration // how long each timed workload runs
	Parallel int           // goroutines of the parallel workload, each on its own name
	Workers  int           // N: workers of the contended workload, all on one name
	Clients  int           // M: clients the contended workers are spread over
	Held     int           // K: locks held at once by one client
	HeldFor  time.Duration // how long refreshes are counted, once the first are due
	TTL      time.Duration // lock TTL of every workload
	// Progress, if set, is told when each workload starts.
	Progress func(workload string)

	skipRefreshCount bool // BenchmarkHeld: acquire, measure memory, release
}

// Defaults are the settings of `lockctl bench` without flags.
var Defaults = Config{
	Duration: 1500 * time.Millisecond,
	Parallel: 16,
	Workers:  8,
	Clients:  2,
	Held:     10000,
	HeldFor:  3 * time.Second,
	TTL:      6 * time.Second,
}

func (c Config) withDefaults() Config {
	d := Defaults
	if c.Duration > 0 {
		d.Duration = c.Duration
	}
	if c.Parallel > 0 {
		d.Parallel = c.Parallel
	}
	if c.Workers > 0 {
		d.Workers = c.Workers
	}
	if c.Clients > 0 {
		d.Clients = c.Clients
	}
	if c.Held > 0 {
		d.Held = c.Held
	}
	if c.HeldFor > 0 {
		d.HeldFor = c.HeldFor
	}
	if c.TTL > 0 {
		d.TTL = c.TTL
	}
	d.Progress = c.Progress
	d.skipRefreshCount = c.skipRefreshCount
	return d
}

// Workloads are the names of the workloads, in the order they run.
var Workloads = []string{"uncontended", "parallel", "contended", "held"}

// Latency summarizes a timed workload.
type Latency struct {
	Ops       int           `json:"ops"`
	OpsPerSec float64       `json:"ops_per_sec"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Errors    int           `json:"errors"`
}

// Contended summarizes the contended workload.
type Contended struct {
	Workers         int           `json:"workers"`
	Clients         int           `json:"clients"`
	Acquisitions    int           `json:"acquisitions"`
	AcquisitionsSec float64       `json:"acquisitions_per_sec"`
	HandoffP50      time.Duration `json:"handoff_p50_ns"`
	HandoffP99      time.Duration `json:"handoff_p99_ns"`
	// Fairness is the most acquisitions of one worker over the fewest
	// (1 is perfectly fair); 0 when a worker never got the lock (MinPer 0).
	Fairness float64 `json:"fairness"`
	MinPer   int     `json:"min_per_worker"`
	MaxPer   int     `json:"max_per_worker"`
	Errors   int     `json:"errors"`
}

// Held summarizes the held-lock workload.
type Held struct {
	Locks        int           `json:"locks"`
	AcquireTime  time.Duration `json:"acquire_ns"`
	BytesPerLock float64       `json:"bytes_per_lock"`
	// RefreshesSec counts locks refreshed per second (through Refresh or
	// RefreshMany); CallsSec counts the driver calls that did it.
	RefreshesSec float64 `json:"refreshes_per_sec"`
	CallsSec     float64 `json:"refresh_calls_per_sec"`
	// Session is true for drivers whose server-side session keeps the
	// locks alive: they make no per-lock refresh calls.
	Session bool `json:"session"`
	Batch   bool `json:"batch_refresh"`
	// Goroutines is how many more goroutines the process ran while
	// holding the locks than before acquiring them.
	Goroutines int  `json:"goroutines"`
	Lost       int  `json:"lost"`
	Errors     int  `json:"errors"`
	Skipped    bool `json:"skipped,omitempty"`
}

// Result is one backend's results.
type Result struct {
	Backend     string        `json:"backend"`
	URL         string        `json:"url"` // redacted
	Uncontended *Latency      `json:"uncontended,omitempty"`
	Parallel    *Latency      `json:"parallel,omitempty"`
	Contended   *Contended    `json:"contended,omitempty"`
	Held        *Held         `json:"held,omitempty"`
	Errors      []string      `json:"errors,omitempty"`
	Took        time.Duration `json:"took_ns"`
}

// Opener opens a driver on the backend; every call returns an independent
// driver (its own connections), as another process would have.
type Opener func(ctx context.Context) (backend.Driver, error)

// URLOpener opens one driver for a backend URL, to check the URL and that
// the store answers, closes it, and returns an Opener for more and the
// Client options of the URL's namespace= and ttl= parameters.
func URLOpener(ctx context.Context, rawURL string) (Opener, []locker.Option, error) {
	drv, opts, err := locker.OpenDriver(ctx, rawURL)
	if err != nil {
		return nil, nil, err
	}
	drv.Close()
	return func(ctx context.Context) (backend.Driver, error) {
		drv, _, err := locker.OpenDriver(ctx, rawURL)
		return drv, err
	}, opts, nil
}

// clients opens Clients on one backend, with common options.
type clients struct {
	open Opener
	opts []locker.Option
}

func (cs clients) client(ctx context.Context) (*locker.Client, error) {
	drv, err := cs.open(ctx)
	if err != nil {
		return nil, err
	}
	c, err := locker.New(drv, cs.opts...)
	if err != nil {
		drv.Close()
	}
	return c, err
}

// counted opens a Client whose driver counts refresh calls.
func (cs clients) counted(ctx context.Context) (*locker.Client, *Counter, error) {
	drv, err := cs.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	cd, wrapped := Count(drv)
	c, err := locker.New(wrapped, cs.opts...)
	if err != nil {
		drv.Close()
	}
	return c, cd, err
}

// Run runs every workload against the backend that open reaches.
// The Clients get a namespace of their own, then opts.
func Run(ctx context.Context, name string, open Opener, opts []locker.Option, cfg Config) Result {
	cfg = cfg.withDefaults()
	start := time.Now()
	r := Result{Backend: name}
	cs := clients{open: open, opts: append([]locker.Option{locker.WithNamespace("bench-" + randHex()), locker.WithDefaultTTL(cfg.TTL)}, opts...)}
	fail := func(w string, err error) { r.Errors = append(r.Errors, fmt.Sprintf("%s: %v", w, err)) }
	step := func(w string) {
		if cfg.Progress != nil {
			cfg.Progress(w)
		}
	}

	step("uncontended")
	if l, err := Uncontended(ctx, cs, cfg); err != nil {
		fail("uncontended", err)
	} else {
		r.Uncontended = &l
	}
	step("parallel")
	if l, err := Parallel(ctx, cs, cfg); err != nil {
		fail("parallel", err)
	} else {
		r.Parallel = &l
	}
	step("contended")
	if c, err := RunContended(ctx, cs, cfg); err != nil {
		fail("contended", err)
	} else {
		r.Contended = &c
	}
	step("held")
	if h, err := RunHeld(ctx, cs, cfg); err != nil {
		fail("held", err)
	} else {
		r.Held = &h
	}
	r.Took = time.Since(start)
	return r
}

func randHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// percentile returns the p-th percentile (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func summarize(lat []time.Duration, elapsed time.Duration, errs int) Latency {
	slices.Sort(lat)
	return Latency{
		Ops:       len(lat),
		OpsPerSec: float64(len(lat)) / elapsed.Seconds(),
		P50:       percentile(lat, 0.50),
		P99:       percentile(lat, 0.99),
		Errors:    errs,
	}
}

// acquireRelease is one operation of the latency workloads.
func acquireRelease(ctx context.Context, c *locker.Client, name string) error {
	l, err := c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

// Uncontended times acquire+release of one name by one goroutine.
func Uncontended(ctx context.Context, cs clients, cfg Config) (Latency, error) {
	cfg = cfg.withDefaults()
	c, err := cs.client(ctx)
	if err != nil {
		return Latency{}, err
	}
	defer c.Close()
	name := "uncontended"
	for range 5 { // warm up connections and caches
		if err := acquireRelease(ctx, c, name); err != nil {
			return Latency{}, err
		}
	}
	var lat []time.Duration
	errs := 0
	start := time.Now()
	for time.Since(start) < cfg.Duration && ctx.Err() == nil {
		t := time.Now()
		if err := acquireRelease(ctx, c, name); err != nil {
			if errs++; errs > 100 {
				return Latency{}, err
			}
			continue
		}
		lat = append(lat, time.Since(t))
	}
	return summarize(lat, time.Since(start), errs), nil
}

// Parallel times acquire+release by cfg.Parallel goroutines of one client,
// each on a name of its own.
func Parallel(ctx context.Context, cs clients, cfg Config) (Latency, error) {
	cfg = cfg.withDefaults()
	c, err := cs.client(ctx)
	if err != nil {
		return Latency{}, err
	}
	defer c.Close()
	for i := range cfg.Parallel {
		if err := acquireRelease(ctx, c, fmt.Sprintf("parallel-%d", i)); err != nil {
			return Latency{}, err
		}
	}
	lats := make([][]time.Duration, cfg.Parallel)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range cfg.Parallel {
		wg.Go(func() {
			name := fmt.Sprintf("parallel-%d", i)
			for time.Since(start) < cfg.Duration && ctx.Err() == nil {
				t := time.Now()
				if err := acquireRelease(ctx, c, name); err != nil {
					if errs.Add(1) > 1000 {
						return
					}
					continue
				}
				lats[i] = append(lats[i], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	return summarize(slices.Concat(lats...), elapsed, int(errs.Load())), nil
}

// RunContended runs cfg.Workers workers over cfg.Clients clients, all
// acquiring and releasing one name.
func RunContended(ctx context.Context, cs clients, cfg Config) (Contended, error) {
	cfg = cfg.withDefaults()
	clients := make([]*locker.Client, cfg.Clients)
	for i := range clients {
		c, err := cs.client(ctx)
		if err != nil {
			for _, c := range clients[:i] {
				c.Close()
			}
			return Contended{}, err
		}
		defer c.Close()
		clients[i] = c
	}
	const name = "contended"
	if err := acquireRelease(ctx, clients[0], name); err != nil {
		return Contended{}, err
	}
	var (
		mu          sync.Mutex // guards the fields below; taken while holding the lock
		lastRelease time.Time
		handoffs    []time.Duration
		counts      = make([]int, cfg.Workers)
		errs        int
	)
	wctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Workers {
		c := clients[w%len(clients)]
		wg.Go(func() {
			for wctx.Err() == nil {
				l, err := c.Acquire(wctx, name)
				if err != nil {
					if wctx.Err() == nil {
						mu.Lock()
						errs++
						mu.Unlock()
					}
					continue
				}
				now := time.Now()
				mu.Lock()
				if !lastRelease.IsZero() {
					handoffs = append(handoffs, now.Sub(lastRelease))
				}
				counts[w]++
				lastRelease = time.Now() // set before the release, read after the next acquire
				mu.Unlock()
				if err := l.Release(context.WithoutCancel(wctx)); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	elapsed := min(time.Since(start), cfg.Duration)
	slices.Sort(handoffs)
	total := 0
	for _, n := range counts {
		total += n
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	fair := 0.0
	if lo > 0 {
		fair = float64(hi) / float64(lo)
	}
	return Contended{
		Workers:         cfg.Workers,
		Clients:         cfg.Clients,
		Acquisitions:    total,
		AcquisitionsSec: float64(total) / elapsed.Seconds(),
		HandoffP50:      percentile(handoffs, 0.5),
		HandoffP99:      percentile(handoffs, 0.99),
		Fairness:        fair,
		MinPer:          lo,
		MaxPer:          hi,
		Errors:          errs,
	}, nil
}

// RunHeld acquires cfg.Held locks on one client with automatic refresh,
// measures the heap and goroutines they cost, counts the refreshes the
// client makes while holding them for cfg.HeldFor, and releases them.
func RunHeld(ctx context.Context, cs clients, cfg Config) (Held, error) {
	cfg = cfg.withDefaults()
	c, cd, err := cs.counted(ctx)
	if err != nil {
		return Held{}, err
	}
	defer c.Close()
	// Warm up: connections, pools, per-client machinery.
	if err := acquireRelease(ctx, c, "held-warmup"); err != nil {
		return Held{}, err
	}
	h := Held{Locks: cfg.Held, Session: cd.session, Batch: cd.batch}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	locks := make([]*locker.Lock, cfg.Held)
	var next atomic.Int64
	var errs atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range min(64, cfg.Held) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Held || ctx.Err() != nil {
					return
				}
				l, err := c.TryAcquire(ctx, fmt.Sprintf("held-%d", i))
				if err != nil {
					errs.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				locks[i] = l
			}
		})
	}
	wg.Wait()
	h.AcquireTime = time.Since(start)
	h.Errors = int(errs.Load())
	if h.Errors == cfg.Held {
		return h, fmt.Errorf("no lock acquired: %w", firstErr)
	}

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := cfg.Held - h.Errors
	h.BytesPerLock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(held)
	h.Goroutines = runtime.NumGoroutine() - g0

	// Count in the steady state: the first refreshes come a third of a
	// TTL after the acquisitions.
	if left := cfg.TTL/3 - time.Since(start); left > 0 && !cfg.skipRefreshCount {
		select {
		case <-time.After(left):
		case <-ctx.Done():
		}
	}
	r0, c0 := cd.refreshed.Load(), cd.calls.Load()
	t0 := time.Now()
	if !cfg.skipRefreshCount {
		select {
		case <-time.After(cfg.HeldFor):
		case <-ctx.Done():
		}
	}
	dt := time.Since(t0).Seconds()
	h.RefreshesSec = float64(cd.refreshed.Load()-r0) / dt
	h.CallsSec = float64(cd.calls.Load()-c0) / dt
	for _, l := range locks {
		if l != nil && l.Err() != nil {
			h.Lost++
		}
	}
	if g := runtime.NumGoroutine() - g0; g > h.Goroutines {
		h.Goroutines = g
	}
	next.Store(0)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for range min(64, cfg.Held) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Held || rctx.Err() != nil {
					return
				}
				if l := locks[i]; l != nil {
					l.Release(rctx)
				}
			}
		})
	}
	wg.Wait()
	return h, nil
}
