package bench

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
)

// The one contended-lock harness: `lockctl bench` and every backend's
// testing.B run their workers through Contend and report the same
// quantities under the same names (see Contention and Contention.Report).

// Acquirer takes the lock for one worker, blocking until it holds it, and
// returns how to release it.
type Acquirer func(ctx context.Context) (release func(context.Context) error, err error)

// ClientAcquirer acquires name with c.Acquire.
func ClientAcquirer(c *locker.Client, name string) Acquirer {
	return func(ctx context.Context) (func(context.Context) error, error) {
		l, err := c.Acquire(ctx, name)
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}

// Worker is one contender.
type Worker struct {
	// Client numbers the client (driver, connections) the worker uses:
	// workers with the same number share it.
	Client  int
	Acquire Acquirer
}

// Contend is one contended run: every worker takes the one lock in turn.
type Contend struct {
	Workers []Worker
	// Hold is how long each holder keeps the lock before releasing it.
	Hold time.Duration
	// The run ends after Acquisitions acquisitions or after Duration,
	// whichever comes first (a zero field does not bound the run).
	Acquisitions int
	Duration     time.Duration
	// Warmup, with Duration, runs the workers that long before the
	// measured Duration: acquisitions that return during it are not
	// counted (when many workers start at once, the first acquisitions
	// measure the start, not the steady state).
	Warmup time.Duration
	// Start, if set, is when the run's clock starts, instead of when Run
	// is called: runs that share it count over the same time.
	Start time.Time
	// RoundTrip, if set, makes one raw request to the store on the
	// workers' connections: the floor a handoff is compared with. It is
	// measured while the workers run, every RoundTripEvery (default 2ms),
	// so it sees the same load; and after them if no sample came in.
	RoundTrip      func(context.Context) error
	RoundTripEvery time.Duration
	// RoundTripOp says what RoundTrip sends, e.g. "PING".
	RoundTripOp string
}

// Event is one acquisition.
type Event struct {
	Worker, Client int
	Called         time.Time // Acquire called
	Got            time.Time // Acquire returned the lock
	Released       time.Time // Release called
}

// Samples are what one or more runs measured; Add merges runs (a benchmark
// that alternates rounds of two contenders keeps one Samples per
// contender).
type Samples struct {
	Workers, Clients int
	Acquisitions     int
	Elapsed          time.Duration
	Handoffs         []time.Duration // previous holder's Release call to the next Acquire's return
	Waits            []time.Duration // Acquire call to its return
	PerWorker        []int
	Retakes          int // handoffs where the releasing worker took the lock again
	SameClient       int // handoffs that stayed on the releasing worker's client
	RoundTrips       []time.Duration
	RoundTripOp      string
	Errors           int
}

// Run runs the workers. It fails only when every worker failed at once (or
// ctx ended before any acquisition); otherwise errors are counted.
func (c Contend) Run(ctx context.Context) (*Samples, error) {
	if len(c.Workers) == 0 || (c.Acquisitions <= 0 && c.Duration <= 0) {
		return nil, errors.New("bench: a contended run needs workers and a bound")
	}
	if c.Warmup < 0 || c.Warmup > 0 && c.Duration <= 0 {
		return nil, errors.New("bench: a contended run's warm-up needs a duration")
	}
	start := cmp.Or(c.Start, time.Now())
	wctx, cancel := context.WithCancel(ctx) // also ends the round-trip probe
	if c.Duration > 0 {
		wctx, cancel = context.WithDeadline(ctx, start.Add(c.Warmup+c.Duration))
	}
	defer cancel()
	var (
		mu       sync.Mutex // guards events, errs, firstErr
		events   = make([]Event, 0, max(c.Acquisitions, 64))
		errs     int
		firstErr error
		taken    atomic.Int64
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs++
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	more := func() bool {
		return wctx.Err() == nil && (c.Acquisitions <= 0 || taken.Add(1) <= int64(c.Acquisitions))
	}
	probe := c.probe(wctx)
	// Acquisitions count from the warm-up's end to the deadline (which
	// ctx may learn of late, under load).
	counted, deadline := start.Add(c.Warmup), start.Add(c.Warmup+c.Duration)
	for w, wk := range c.Workers {
		wg.Go(func() {
			for failures := 0; more() && failures < 100; {
				e := Event{Worker: w, Client: wk.Client, Called: time.Now()}
				release, err := wk.Acquire(wctx)
				if err != nil {
					if wctx.Err() == nil {
						fail(err)
						failures++
					}
					continue
				}
				e.Got = time.Now()
				if c.Hold > 0 {
					time.Sleep(c.Hold)
				}
				e.Released = time.Now()
				if !e.Got.Before(counted) && (c.Duration <= 0 || e.Got.Before(deadline)) {
					mu.Lock()
					events = append(events, e)
					mu.Unlock()
				}
				if err := release(context.WithoutCancel(wctx)); err != nil {
					fail(err)
					failures++
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(counted)
	if c.Duration > 0 {
		elapsed = min(elapsed, c.Duration)
	}
	cancel()
	rtts := probe()
	if len(rtts) == 0 && c.RoundTrip != nil {
		for range 50 {
			t := time.Now()
			if err := c.RoundTrip(ctx); err != nil {
				fail(err)
				break
			}
			rtts = append(rtts, time.Since(t))
		}
	}
	if len(events) == 0 && firstErr != nil {
		return nil, firstErr
	}
	if len(events) == 0 && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	clients := map[int]bool{}
	for _, w := range c.Workers {
		clients[w.Client] = true
	}
	s := &Samples{Workers: len(c.Workers), Clients: len(clients), PerWorker: make([]int, len(c.Workers)), RoundTripOp: c.RoundTripOp}
	s.add(events, elapsed, rtts, errs)
	return s, nil
}

// probe starts measuring the round trip until ctx ends; the returned
// function waits for it and returns the samples.
func (c Contend) probe(ctx context.Context) func() []time.Duration {
	if c.RoundTrip == nil {
		return func() []time.Duration { return nil }
	}
	every := c.RoundTripEvery
	if every <= 0 {
		every = 2 * time.Millisecond
	}
	done := make(chan []time.Duration)
	go func() {
		var ds []time.Duration
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- ds
				return
			case <-tick.C:
			}
			t := time.Now()
			if err := c.RoundTrip(ctx); err != nil {
				continue // ended with ctx, or the store's fault: the workers count those
			}
			ds = append(ds, time.Since(t))
		}
	}()
	return func() []time.Duration { return <-done }
}

// add takes one run's events.
func (s *Samples) add(events []Event, elapsed time.Duration, rtts []time.Duration, errs int) {
	slices.SortFunc(events, func(x, y Event) int { return x.Got.Compare(y.Got) })
	for i, e := range events {
		s.Waits = append(s.Waits, e.Got.Sub(e.Called))
		s.PerWorker[e.Worker]++
		if i == 0 {
			continue
		}
		prev := events[i-1]
		s.Handoffs = append(s.Handoffs, e.Got.Sub(prev.Released))
		if e.Worker == prev.Worker {
			s.Retakes++
		}
		if e.Client == prev.Client {
			s.SameClient++
		}
	}
	s.Acquisitions += len(events)
	s.Elapsed += elapsed
	s.RoundTrips = append(s.RoundTrips, rtts...)
	s.Errors += errs
}

// Add merges another run's samples (of the same workers) into s.
func (s *Samples) Add(o *Samples) {
	if len(s.PerWorker) < len(o.PerWorker) {
		s.PerWorker = append(s.PerWorker, make([]int, len(o.PerWorker)-len(s.PerWorker))...)
	}
	for i, n := range o.PerWorker {
		s.PerWorker[i] += n
	}
	s.Workers, s.Clients = max(s.Workers, o.Workers), max(s.Clients, o.Clients)
	s.Acquisitions += o.Acquisitions
	s.Elapsed += o.Elapsed
	s.Handoffs = append(s.Handoffs, o.Handoffs...)
	s.Waits = append(s.Waits, o.Waits...)
	s.Retakes += o.Retakes
	s.SameClient += o.SameClient
	s.RoundTrips = append(s.RoundTrips, o.RoundTrips...)
	s.RoundTripOp = cmp.Or(s.RoundTripOp, o.RoundTripOp)
	s.Errors += o.Errors
}

// Contention summarizes a contended workload. Every report of one (the
// lockctl table and JSON, each backend's testing.B) uses these quantities.
type Contention struct {
	Workers         int     `json:"workers"`
	Clients         int     `json:"clients"`
	Acquisitions    int     `json:"acquisitions"`
	AcquisitionsSec float64 `json:"acquisitions_per_sec"`
	// Handoff: from the holder calling Release to the next holder's
	// Acquire returning.
	HandoffP50 time.Duration `json:"handoff_p50_ns"`
	HandoffP99 time.Duration `json:"handoff_p99_ns"`
	// Wait: from a worker calling Acquire to its return.
	WaitP50 time.Duration `json:"wait_p50_ns"`
	WaitP99 time.Duration `json:"wait_p99_ns"`
	// Fairness is the most acquisitions of one worker over the fewest
	// (1 is perfectly fair); 0 when a worker never got the lock (MinPer 0).
	Fairness float64 `json:"fairness"`
	MinPer   int     `json:"min_per_worker"`
	MaxPer   int     `json:"max_per_worker"`
	// Retake is the share of handoffs (0..1) where the worker that
	// released the lock took it again; SameClient, where the next holder
	// used the releasing worker's client.
	Retake     float64 `json:"retake"`
	SameClient float64 `json:"same_client"`
	// RoundTrip is the median raw round trip to the store, measured in the
	// same run on the workers' connections (0 if not measured), and
	// HandoffPerRoundTrip the median handoff over it.
	RoundTrip           time.Duration `json:"round_trip_p50_ns,omitempty"`
	RoundTripOp         string        `json:"round_trip_op,omitempty"`
	HandoffPerRoundTrip float64       `json:"handoff_per_round_trip,omitempty"`
	Errors              int           `json:"errors"`
}

// Summary computes the figures.
func (s *Samples) Summary() Contention {
	c := Contention{
		Workers:      s.Workers,
		Clients:      s.Clients,
		Acquisitions: s.Acquisitions,
		HandoffP50:   Percentile(s.Handoffs, 0.50),
		HandoffP99:   Percentile(s.Handoffs, 0.99),
		WaitP50:      Percentile(s.Waits, 0.50),
		WaitP99:      Percentile(s.Waits, 0.99),
		RoundTrip:    Percentile(s.RoundTrips, 0.50),
		RoundTripOp:  s.RoundTripOp,
		Errors:       s.Errors,
	}
	if s.Elapsed > 0 {
		c.AcquisitionsSec = float64(s.Acquisitions) / s.Elapsed.Seconds()
	}
	if len(s.PerWorker) > 0 {
		c.MinPer, c.MaxPer = slices.Min(s.PerWorker), slices.Max(s.PerWorker)
		if c.MinPer > 0 {
			c.Fairness = float64(c.MaxPer) / float64(c.MinPer)
		}
	}
	if n := len(s.Handoffs); n > 0 {
		c.Retake = float64(s.Retakes) / float64(n)
		c.SameClient = float64(s.SameClient) / float64(n)
	}
	if c.RoundTrip > 0 {
		c.HandoffPerRoundTrip = float64(c.HandoffP50) / float64(c.RoundTrip)
	}
	return c
}

// Reporter is what Report writes to: a *testing.B (this package does not
// import testing, so that lockctl does not link it).
type Reporter interface {
	ReportMetric(n float64, unit string)
}

// Report writes the figures as benchmark metrics, each under the same name
// in every package, prefixed with prefix and "-" when prefix is not empty
// (to compare contenders in one benchmark).
func (c Contention) Report(r Reporter, prefix string) {
	if prefix != "" {
		prefix += "-"
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r.ReportMetric(c.AcquisitionsSec, prefix+"acq/s")
	r.ReportMetric(us(c.HandoffP50), prefix+"handoff-p50-µs")
	r.ReportMetric(us(c.HandoffP99), prefix+"handoff-p99-µs")
	r.ReportMetric(us(c.WaitP99), prefix+"wait-p99-µs")
	r.ReportMetric(c.Fairness, prefix+"fairness")
	r.ReportMetric(100*c.Retake, prefix+"retake-%")
	r.ReportMetric(100*c.SameClient, prefix+"same-client-%")
	if c.RoundTrip > 0 {
		r.ReportMetric(us(c.RoundTrip), prefix+"rtt-p50-µs")
		r.ReportMetric(c.HandoffPerRoundTrip, prefix+"handoff/rtt")
	}
	if c.Errors > 0 {
		r.ReportMetric(float64(c.Errors), prefix+"errors")
	}
}

// B is the part of *testing.B that RunB uses.
type B interface {
	Reporter
	Helper()
	ResetTimer()
	StopTimer()
	Fatal(args ...any)
}

// RunB runs c as the timed part of a benchmark (the timer covers the run
// only) and fails it if the run fails.
func (c Contend) RunB(b B) *Samples {
	b.Helper()
	b.ResetTimer()
	s, err := c.Run(context.Background())
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// Percentile returns the p-th percentile (0..1) of ds (nearest rank), 0 for
// none. ds is not modified.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
