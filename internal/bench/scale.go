package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// Scale summarizes a contended workload at scale: Workers workers over
// Clients clients, on Names names (Workers/Names on each).
type Scale struct {
	Names           int           `json:"names"`
	Workers         int           `json:"workers"` // in all
	Clients         int           `json:"clients"`
	Acquisitions    int           `json:"acquisitions"`
	AcquisitionsSec float64       `json:"acquisitions_per_sec"`
	WaitP50         time.Duration `json:"wait_p50_ns"`
	WaitP99         time.Duration `json:"wait_p99_ns"`
	HandoffP50      time.Duration `json:"handoff_p50_ns"`
	Fairness        float64       `json:"fairness"` // per name, worst; 0 if a worker starved
	Retake          float64       `json:"retake"`
	// CPUPerAcq is the process's CPU time (user+system, getrusage) during
	// the run over the acquisitions: the client side only, unless the
	// store is in the process (mem, file's kernel work).
	CPUPerAcq time.Duration `json:"cpu_per_acquisition_ns"`
	// Tries is the tries per acquisition, counted in TryCalls over the
	// run's counted window; TriesFrom says where. TriesStore: the driver
	// has measure.StoreTries, and Tries is that count over the window, summed
	// over the workload's clients: the requests that could grant a waiting
	// acquisition that the driver sent, whether it waits in its own queue
	// (Queued) or not. TriesClient: the driver TryAcquire calls the
	// Client made (the first try of each Acquire, the try after
	// subscribing to releases, and a try for every wake-up: a
	// notification, a local release, a backoff's end). Either way a
	// release that wakes every waiter (a herd) makes Tries grow with the
	// waiters, and O(1) wake-ups keep it flat. TriesNone (and Tries 0): a
	// queued driver that counts none, whose waits are not the Client's
	// tries.
	Tries     float64 `json:"tries_per_acquisition"`
	TryCalls  int64   `json:"try_calls"`
	TriesFrom string  `json:"tries_from"`
	Queued    bool    `json:"queued"` // the driver queues locks' waiters (queuesLocks)
	Errors    int     `json:"errors"`
}

// queuesLocks reports whether drv waits for locks in its store's own
// queue: a backend.Queuer of Exclusive claims.
func queuesLocks(drv backend.Driver) bool {
	q, ok := backend.As[backend.Queuer](drv)
	return ok && q.QueueModes().Has(backend.Exclusive)
}

// Where Scale.Tries comes from.
const (
	TriesStore  = "store"  // the driver's measure.StoreTries
	TriesClient = "client" // the Client's TryAcquire calls
	TriesNone   = ""       // a queued driver that counts none: not counted
)

// tryCounter counts the TryAcquire calls made in a window of time; As
// finds the driver's optional interfaces through Unwrap, so the Client
// waits as it would without it.
type tryCounter struct {
	backend.Driver
	*tries
}

// tries counts calls made from from to to, times since base (on the
// monotonic clock, as Contend's: the wall clock may be slewed); to 0 means
// no end.
type tries struct {
	base        time.Time
	n, from, to atomic.Int64
}

func newTries() *tries { return &tries{base: time.Now()} }

// window counts the calls from from to to.
func (t *tries) window(from, to time.Time) {
	t.n.Store(0)
	t.from.Store(int64(from.Sub(t.base)))
	t.to.Store(int64(to.Sub(t.base)))
}

func (d tryCounter) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if now := int64(time.Since(d.base)); now >= d.from.Load() && (d.to.Load() == 0 || now < d.to.Load()) {
		d.n.Add(1)
	}
	return d.Driver.TryAcquire(ctx, c)
}

func (d tryCounter) Unwrap() backend.Driver { return d.Driver }

// RunScale runs workers contending for names locks over clients clients:
// worker w takes name w%names on client scaleClient(w, …), so that every
// name's workers are spread over the clients. The workers start at once, and
// the figures count from a warm-up of a third of cfg.Duration on.
func RunScale(ctx context.Context, cs clients, cfg Config, names, workers, nclients int) (Scale, error) {
	cfg = cfg.withDefaults()
	r := Scale{Names: names, Workers: workers, Clients: nclients}
	if names <= 0 || workers < names || nclients <= 0 {
		return r, fmt.Errorf("bench: scale: %d workers on %d names over %d clients", workers, names, nclients)
	}
	counter := newTries()
	var (
		cl     []*locker.Client
		triers []func() uint64 // one per client, when the driver counts
	)
	defer func() {
		for _, c := range cl {
			c.Close()
		}
	}()
	for range nclients {
		drv, err := cs.open(ctx)
		if err != nil {
			return r, err
		}
		r.Queued = r.Queued || queuesLocks(drv)
		if st, ok := hook(drv, measure.StoreTries); ok {
			triers = append(triers, st)
		}
		c, err := locker.New(tryCounter{drv, counter}, cs.opts...)
		if err != nil {
			drv.Close()
			return r, err
		}
		cl = append(cl, c)
	}
	if len(triers) != len(cl) {
		triers = nil // counted on every client or none
	}
	storeTries := func() (n uint64) {
		for _, st := range triers {
			n += st()
		}
		return n
	}
	for _, c := range cl { // warm up each client's connections
		if err := acquireRelease(ctx, c, "scale-warmup"); err != nil {
			return r, err
		}
	}
	warmup := cfg.Duration / 3
	start := time.Now()
	marks := &storeMarks{from: start.Add(warmup), to: start.Add(warmup + cfg.Duration), before: storeTries()}
	runs := make([]Contend, names)
	for w := range workers {
		n, k := w%names, scaleClient(w, names, nclients)
		acq := ClientAcquirer(cl[k], fmt.Sprintf("scale-%d", n))
		if triers != nil {
			acq = marks.acquirer(acq, storeTries)
		}
		runs[n].Workers = append(runs[n].Workers, Worker{Client: k, Acquire: acq})
	}
	samples := make([]*Samples, names)
	errs := make([]error, names)
	var wg sync.WaitGroup
	// Counted from the warm-up's end, as Contend counts acquisitions (those
	// that return in the window): the Client's tries that start in the
	// same window; the store tries (cumulative counters) between the last
	// acquisition that returned before the window and the last in it (see
	// storeMarks: timers fire late on a busy machine); the CPU time
	// between two readings at the window's ends, as near as timers fire,
	// one after the other (two timers' callbacks may run in either order).
	counter.window(marks.from, marks.to)
	var c0, c1 time.Duration
	cpuCtx, stopCPU := context.WithCancel(ctx)
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		sleepUntil(cpuCtx, marks.from)
		c0 = cpuTime()
		sleepUntil(cpuCtx, marks.to)
		c1 = cpuTime()
	}()
	for i := range runs {
		runs[i].Duration, runs[i].Warmup, runs[i].Start = cfg.Duration, warmup, start
		wg.Go(func() { samples[i], errs[i] = runs[i].Run(ctx) })
	}
	wg.Wait()
	elapsed := min(time.Since(start)-warmup, cfg.Duration)
	stopCPU() // read now if ctx ended the run early
	<-cpuDone
	cpu, calls := c1-c0, counter.n.Load()
	switch {
	case triers != nil:
		r.TriesFrom, calls = TriesStore, marks.tries()
	case !r.Queued:
		r.TriesFrom = TriesClient
	default:
		calls = 0
	}

	var all Samples
	fair := 0.0
	for i, s := range samples {
		if s == nil {
			r.Errors++
			if r.Errors == names {
				return r, errs[i]
			}
			continue
		}
		k := s.Summary()
		if k.Fairness == 0 || fair < 0 {
			fair = -1 // a worker of some name never got the lock
		} else {
			fair = max(fair, k.Fairness)
		}
		all.Add(s)
	}
	r.Acquisitions = all.Acquisitions
	if elapsed > 0 { // not when ctx ended the run in its warm-up
		r.AcquisitionsSec = float64(all.Acquisitions) / elapsed.Seconds()
	}
	r.WaitP50, r.WaitP99 = Percentile(all.Waits, 0.5), Percentile(all.Waits, 0.99)
	r.HandoffP50 = Percentile(all.Handoffs, 0.5)
	r.Fairness = max(fair, 0)
	if n := len(all.Handoffs); n > 0 {
		r.Retake = float64(all.Retakes) / float64(n)
	}
	r.Errors += all.Errors
	if all.Acquisitions > 0 {
		r.CPUPerAcq = cpu / time.Duration(all.Acquisitions)
		if r.TriesFrom != TriesNone {
			r.Tries, r.TryCalls = float64(calls)/float64(all.Acquisitions), calls
		}
	}
	return r, nil
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// storeMarks reads the drivers' store tries (cumulative) as each
// acquisition returns, and keeps the latest reading before the window
// (from, to) and in it: the tries between the two are those sent from the
// last acquisition before the window to the last in it, the same
// acquisitions Contend counts, to within one at each end.
type storeMarks struct {
	from, to   time.Time
	mu         sync.Mutex
	before, in uint64 // the latest readings before and in the window
}

// acquirer wraps acq to read count when it returns a lock.
func (m *storeMarks) acquirer(acq Acquirer, count func() uint64) Acquirer {
	return func(ctx context.Context) (func(context.Context) error, error) {
		rel, err := acq(ctx)
		if err == nil {
			m.mark(time.Now(), count())
		}
		return rel, err
	}
}

func (m *storeMarks) mark(now time.Time, n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case now.Before(m.from):
		m.before = max(m.before, n)
	case now.Before(m.to):
		m.in = max(m.in, n)
	}
}

// tries returns the tries between the latest readings before the window
// and in it (0 when no acquisition returned in it).
func (m *storeMarks) tries() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.in < m.before {
		return 0
	}
	return int64(m.in - m.before)
}

// scaleClient is the client of worker w: the name's workers take the
// clients in turn from the name's own first one (w%clients would put them
// all on one client when clients divides names).
func scaleClient(w, names, clients int) int { return (w%names + w/names) % clients }
