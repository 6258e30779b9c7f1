// Package bench runs the workloads of `lockctl bench` against one backend:
// uncontended acquire+release, parallel acquire+release on distinct names,
// N workers contending for one name across M clients, and K locks held with
// automatic refresh. Its contended harness (Contend, Samples, Contention,
// in contend.go) is also the one every backend's testing.B uses. It does
// not import testing, so that lockctl does not link it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
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
	// SemLimit and SemWorkers size the semaphore workload: workers spread
	// over Clients clients share a semaphore of SemLimit permits.
	SemLimit   int
	SemWorkers int
	// The scale workloads: ScaleWorkers workers over ScaleClients clients
	// on one name, and first as many workers as clients, to see how the
	// figures change as waiters grow; then Names names with NameWorkers
	// workers each, over NameClients clients.
	ScaleWorkers int
	ScaleClients int
	Names        int
	NameWorkers  int
	NameClients  int
	// Only, if not empty, lists the workloads to run (see Workloads).
	Only []string
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

	SemLimit:   4,
	SemWorkers: 16,

	ScaleWorkers: 64,
	ScaleClients: 8,
	Names:        1000,
	NameWorkers:  4,
	NameClients:  4,
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
	if c.SemLimit > 0 {
		d.SemLimit = c.SemLimit
	}
	if c.SemWorkers > 0 {
		d.SemWorkers = c.SemWorkers
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&d.ScaleWorkers, c.ScaleWorkers}, {&d.ScaleClients, c.ScaleClients},
		{&d.Names, c.Names}, {&d.NameWorkers, c.NameWorkers}, {&d.NameClients, c.NameClients},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	d.Only = c.Only
	d.Progress = c.Progress
	d.skipRefreshCount = c.skipRefreshCount
	return d
}

// Workloads are the names of the workloads, in the order they run.
var Workloads = []string{"uncontended", "parallel", "contended", "scale", "names", "held", "semaphore", "set"}

// Runs reports whether the workload w is among those cfg runs.
func (c Config) Runs(w string) bool { return len(c.Only) == 0 || slices.Contains(c.Only, w) }

// Latency summarizes a timed workload.
type Latency struct {
	Ops       int           `json:"ops"`
	OpsPerSec float64       `json:"ops_per_sec"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Errors    int           `json:"errors"`
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
	Backend     string   `json:"backend"`
	URL         string   `json:"url"` // redacted
	Uncontended *Latency `json:"uncontended,omitempty"`
	// Floor compares the uncontended acquire+release with the driver's raw
	// floor and the Client's other paths, interleaved.
	Floor     *Floor      `json:"floor,omitempty"`
	Parallel  *Throughput `json:"parallel,omitempty"`
	Contended *Contention `json:"contended,omitempty"`
	// ScaleFew and Scale: as many workers as clients, then ScaleWorkers,
	// on one name; Names: many names with a few workers each.
	ScaleFew  *Scale        `json:"scale_few,omitempty"`
	Scale     *Scale        `json:"scale,omitempty"`
	Names     *Scale        `json:"names,omitempty"`
	Held      *Held         `json:"held,omitempty"`
	Semaphore *Semaphore    `json:"semaphore,omitempty"`
	LockSet   *LockSet      `json:"set,omitempty"`
	Errors    []string      `json:"errors,omitempty"`
	Took      time.Duration `json:"took_ns"`
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
	// ns is the namespace of the keys the bare driver calls use: the
	// Clients' own, unless a URL's namespace= replaced it.
	ns string
}

func (cs clients) client(ctx context.Context) (*locker.Client, error) {
	c, _, err := cs.clientDriver(ctx)
	return c, err
}

// clientDriver opens a Client and returns its driver too, for the calls
// that measure the store itself.
func (cs clients) clientDriver(ctx context.Context) (*locker.Client, backend.Driver, error) {
	drv, err := cs.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := locker.New(drv, cs.opts...)
	if err != nil {
		drv.Close()
	}
	return c, drv, err
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
	cs := clients{open: open, ns: "bench-" + testutil.RandHex(4)}
	cs.opts = append([]locker.Option{locker.WithNamespace(cs.ns), locker.WithDefaultTTL(cfg.TTL)}, opts...)
	fail := func(w string, err error) { r.Errors = append(r.Errors, fmt.Sprintf("%s: %v", w, err)) }
	step := func(w string) {
		if cfg.Progress != nil {
			cfg.Progress(w)
		}
	}

	type workload struct {
		name string
		run  func() error
	}
	for _, w := range []workload{
		{"uncontended", func() (err error) {
			var l Latency
			l, r.Floor, err = Uncontended(ctx, cs, cfg)
			if err == nil {
				r.Uncontended = &l
			}
			return err
		}},
		{"parallel", func() error { return set(&r.Parallel)(Parallel(ctx, cs, cfg)) }},
		{"contended", func() error { return set(&r.Contended)(RunContended(ctx, cs, cfg)) }},
		{"scale", func() error {
			// As many workers as clients first: one waiter per client.
			if err := set(&r.ScaleFew)(RunScale(ctx, cs, cfg, 1, cfg.ScaleClients, cfg.ScaleClients)); err != nil {
				return err
			}
			return set(&r.Scale)(RunScale(ctx, cs, cfg, 1, cfg.ScaleWorkers, cfg.ScaleClients))
		}},
		{"names", func() error {
			return set(&r.Names)(RunScale(ctx, cs, cfg, cfg.Names, cfg.Names*cfg.NameWorkers, cfg.NameClients))
		}},
		{"held", func() error { return set(&r.Held)(RunHeld(ctx, cs, cfg)) }},
		{"semaphore", func() error { return set(&r.Semaphore)(RunSemaphore(ctx, cs, cfg)) }},
		{"set", func() error { return set(&r.LockSet)(RunLockSet(ctx, cs, cfg)) }},
	} {
		if !cfg.Runs(w.name) || ctx.Err() != nil {
			continue
		}
		step(w.name)
		if err := w.run(); err != nil {
			fail(w.name, err)
		}
	}
	r.Took = time.Since(start)
	return r
}

// set returns a function that stores a workload's result in *dst, unless
// it failed.
func set[T any](dst **T) func(T, error) error {
	return func(v T, err error) error {
		if err == nil {
			*dst = &v
		}
		return err
	}
}

func summarize(lat []time.Duration, elapsed time.Duration, errs int) Latency {
	l := Latency{
		Ops:    len(lat),
		P50:    Percentile(lat, 0.50),
		P99:    Percentile(lat, 0.99),
		Errors: errs,
	}
	if elapsed > 0 {
		l.OpsPerSec = float64(len(lat)) / elapsed.Seconds()
	}
	return l
}

// acquireRelease is one operation of the latency workloads.
func acquireRelease(ctx context.Context, c *locker.Client, name string) error {
	l, err := c.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

// RunContended runs cfg.Workers workers over cfg.Clients clients, all
// acquiring and releasing one name, through Contend. The round trip it
// compares handoffs with is a refused TryAcquire (a name another client
// holds) on the first client's driver: the least request a driver makes,
// portable across backends (one request on most; a create, a listing and a
// delete on ZooKeeper).
func RunContended(ctx context.Context, cs clients, cfg Config) (Contention, error) {
	cfg = cfg.withDefaults()
	clients := make([]*locker.Client, cfg.Clients)
	drivers := make([]backend.Driver, cfg.Clients)
	for i := range clients {
		c, drv, err := cs.clientDriver(ctx)
		if err != nil {
			for _, c := range clients[:i] {
				c.Close()
			}
			return Contention{}, err
		}
		defer c.Close()
		clients[i], drivers[i] = c, drv
	}
	const name = "contended"
	for _, c := range clients { // warm up each client's connections
		if err := acquireRelease(ctx, c, name); err != nil {
			return Contention{}, err
		}
	}
	rtt, done, err := refusedTry(ctx, drivers, cfg.Duration+cfg.TTL)
	if err != nil {
		return Contention{}, err
	}
	defer done()
	run := Contend{Duration: cfg.Duration, RoundTrip: rtt, RoundTripOp: "refused TryAcquire"}
	for w := range cfg.Workers {
		run.Workers = append(run.Workers, Worker{Client: w % len(clients), Acquire: ClientAcquirer(clients[w%len(clients)], name)})
	}
	s, err := run.Run(ctx)
	if err != nil {
		return Contention{}, err
	}
	return s.Summary(), nil
}

// refusedTry holds a probe name with the last driver for ttl, and returns
// a TryAcquire of it by the first driver, which the store refuses, and how
// to release the probe.
func refusedTry(ctx context.Context, drivers []backend.Driver, ttl time.Duration) (func(context.Context) error, func(), error) {
	key := "bench-" + testutil.RandHex(4) + "/round-trip"
	holder := backend.Claim{Key: key, Token: testutil.Token(), TTL: ttl}
	hd := drivers[len(drivers)-1]
	if _, err := hd.TryAcquire(ctx, holder); err != nil {
		return nil, nil, err
	}
	done := func() { hd.Release(context.WithoutCancel(ctx), holder) }
	probe := backend.Claim{Key: key, Token: testutil.Token(), TTL: ttl}
	try := func(ctx context.Context) error {
		_, err := drivers[0].TryAcquire(ctx, probe)
		if errors.Is(err, backend.ErrNotAcquired) {
			return nil
		}
		if err == nil {
			drivers[0].Release(ctx, probe)
			return errors.New("bench: the round-trip probe got a lock another driver holds")
		}
		return err
	}
	return try, done, nil
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
	// The previous workload's goroutines (a scale run's thousands of
	// waiters, their drivers' subscriptions) may still be ending: the
	// baseline comes once they have.
	settle(ctx, settleQuiet, settleMax)
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

// How long settle waits for goroutines to stop ending: quiet without a new
// low, at most settleMax in all.
const (
	settleQuiet = 100 * time.Millisecond
	settleMax   = 5 * time.Second
)

// settle waits until the process's goroutine count has made no new low for
// quiet, or for limit at most, or ctx ends, and returns the count.
func settle(ctx context.Context, quiet, limit time.Duration) int {
	const every = 5 * time.Millisecond
	low := runtime.NumGoroutine()
	t := time.NewTicker(every)
	defer t.Stop()
	start, lowAt := time.Now(), time.Now()
	for time.Since(lowAt) < quiet && time.Since(start) < limit {
		select {
		case <-ctx.Done():
			return low
		case <-t.C:
		}
		if n := runtime.NumGoroutine(); n < low {
			low, lowAt = n, time.Now()
		}
	}
	return runtime.NumGoroutine()
}
