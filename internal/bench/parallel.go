package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// The parallel workload: cfg.Parallel goroutines of one Client, each on a
// name of its own, against the same goroutines running the driver's raw
// floor on the same connections. With the CPUs saturated (16 goroutines on
// a small machine) the work each cycle costs the client and the store
// decides the rate, so the subjects run in alternating blocks over several
// rounds and each ratio is taken within a round, as in the uncontended
// workload.

// Round is one subject's block in one round of Interleave.
type Round struct {
	Cycles  int
	Errors  int
	Elapsed time.Duration
	CPU     time.Duration // this process's CPU time (user+system) over the block
	// Store is what the store's counters grew by over the block, when
	// InterleaveGauged read them (its CPU, its commands).
	Store map[string]float64
	lat   []time.Duration
}

// Gauge reads a store's cumulative counters: its CPU, its commands.
type Gauge func(ctx context.Context) (map[string]float64, error)

// PerSec is the block's cycles per second.
func (r Round) PerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Cycles) / r.Elapsed.Seconds()
}

// P50 is the median time of the block's cycles.
func (r Round) P50() time.Duration { return Percentile(r.lat, 0.5) }

// CPUPerCycle is the process's CPU time per cycle over the block.
func (r Round) CPUPerCycle() time.Duration {
	if r.Cycles == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Cycles)
}

// Interleave runs each op by goroutines goroutines at once for per, the
// subjects one after the other in an order that turns each round, and
// returns each subject's rounds ([subject][round]). Goroutine g of every
// subject calls op(ctx, g), so that each may keep a name of its own. Each
// op runs once per goroutine first, to warm connections and scripts. A
// subject that fails more than 1000 times in a block ends the run.
func Interleave(ctx context.Context, goroutines, rounds int, per time.Duration, ops ...func(ctx context.Context, g int) error) ([][]Round, error) {
	return InterleaveGauged(ctx, nil, goroutines, rounds, per, ops...)
}

// InterleaveGauged is Interleave that reads gauge, if not nil, before and
// after each block, into the block's Round.Store: the store should serve
// nothing else meanwhile.
func InterleaveGauged(ctx context.Context, gauge Gauge, goroutines, rounds int, per time.Duration, ops ...func(ctx context.Context, g int) error) ([][]Round, error) {
	out := make([][]Round, len(ops))
	for j, op := range ops {
		if _, err := block(ctx, goroutines, 0, op); err != nil {
			return nil, fmt.Errorf("subject %d: warm-up: %w", j, err)
		}
	}
	for r := range rounds {
		for k := range ops {
			j := (k + r) % len(ops)
			rd, err := gauged(ctx, gauge, func() (Round, error) { return block(ctx, goroutines, per, ops[j]) })
			if err != nil {
				return nil, fmt.Errorf("subject %d: %w", j, err)
			}
			out[j] = append(out[j], rd)
		}
	}
	return out, nil
}

// gauged runs run, and reads gauge around it.
func gauged(ctx context.Context, gauge Gauge, run func() (Round, error)) (Round, error) {
	if gauge == nil {
		return run()
	}
	before, err := gauge(ctx)
	if err != nil {
		return Round{}, fmt.Errorf("gauge: %w", err)
	}
	rd, err := run()
	if err != nil {
		return rd, err
	}
	after, err := gauge(ctx)
	if err != nil {
		return Round{}, fmt.Errorf("gauge: %w", err)
	}
	rd.Store = make(map[string]float64, len(after))
	for k, v := range after {
		rd.Store[k] = v - before[k]
	}
	return rd, nil
}

// block runs op by n goroutines until per has passed (once each if per is
// zero).
func block(ctx context.Context, n int, per time.Duration, op func(context.Context, int) error) (Round, error) {
	lats := make([][]time.Duration, n)
	errs := make([]int, n)
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0, start := cpuTime(), time.Now()
	for g := range n {
		wg.Go(func() {
			for i := 0; i == 0 || time.Since(start) < per; i++ {
				if ctx.Err() != nil {
					return
				}
				t := time.Now()
				if err := op(ctx, g); err != nil {
					if errs[g]++; errs[g] > 1000/n || per == 0 {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
					continue
				}
				lats[g] = append(lats[g], time.Since(t))
			}
		})
	}
	wg.Wait()
	rd := Round{Elapsed: time.Since(start), CPU: cpuTime() - cpu0, lat: slices.Concat(lats...)}
	rd.Cycles = len(rd.lat)
	for _, e := range errs {
		rd.Errors += e
	}
	if first == nil {
		first = ctx.Err()
	}
	return rd, first
}

// Ratio is f of a's rounds over f of b's, per round.
func Ratio(a, b []Round, f func(Round) float64) Spread {
	var xs []float64
	for i := range min(len(a), len(b)) {
		if fb := f(b[i]); fb > 0 {
			xs = append(xs, f(a[i])/fb)
		}
	}
	return spread(xs)
}

// PerSec and CPUPerCycle as functions of a Round, for Ratio.
var (
	PerSec      = Round.PerSec
	CPUPerCycle = func(r Round) float64 { return float64(r.CPUPerCycle()) }
)

// Rate sums up one subject of a parallel comparison.
type Rate struct {
	Cycles    int           `json:"cycles"`
	PerSec    Spread        `json:"cycles_per_sec"` // over the rounds
	CPU       time.Duration `json:"cpu_per_cycle_ns"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Errors    int           `json:"errors"`
	perRounds []Round
}

// RateOf sums up a subject's rounds.
func RateOf(rounds []Round) Rate {
	var r Rate
	var cpu time.Duration
	var lat []time.Duration
	var rates []float64
	for _, rd := range rounds {
		r.Cycles += rd.Cycles
		r.Errors += rd.Errors
		cpu += rd.CPU
		lat = append(lat, rd.lat...)
		rates = append(rates, rd.PerSec())
	}
	if r.Cycles > 0 {
		r.CPU = cpu / time.Duration(r.Cycles)
	}
	r.PerSec, r.P50, r.P99, r.perRounds = spread(rates), Percentile(lat, 0.5), Percentile(lat, 0.99), rounds
	return r
}

// Throughput is the parallel workload's comparison.
type Throughput struct {
	Goroutines int  `json:"goroutines"`
	Rounds     int  `json:"rounds"`
	Lock       Rate `json:"lock"`
	// Floor, VsFloor and CPUVsFloor are absent without a raw floor:
	// VsFloor is the lock's cycles per second over the floor's, per round;
	// CPUVsFloor its client CPU per cycle over the floor's.
	Floor      *Rate  `json:"floor,omitempty"`
	VsFloor    Spread `json:"vs_floor"`
	CPUVsFloor Spread `json:"cpu_vs_floor"`
}

const parallelRounds = 6

// Parallel runs acquire+release by cfg.Parallel goroutines of one Client,
// each on a name of its own, interleaved with the raw floor (on names of
// their own) on the same driver.
func Parallel(ctx context.Context, cs clients, cfg Config) (Throughput, error) {
	cfg = cfg.withDefaults()
	c, drv, err := cs.clientDriver(ctx)
	if err != nil {
		return Throughput{}, err
	}
	defer c.Close()
	names := make([]string, cfg.Parallel)
	for g := range names {
		names[g] = fmt.Sprintf("parallel-%d", g)
	}
	ops := []func(context.Context, int) error{func(ctx context.Context, g int) error {
		return acquireRelease(ctx, c, names[g])
	}}
	raw, floor := hook(drv, measure.RawFloor)
	if floor {
		keys := make([]string, cfg.Parallel)
		for g := range keys {
			keys[g] = backend.Key(cs.ns, fmt.Sprintf("parallel-floor-%d", g))
		}
		ops = append(ops, func(ctx context.Context, g int) error { return raw(ctx, keys[g]) })
	}
	per := cfg.Duration / time.Duration(parallelRounds*len(ops))
	rounds, err := Interleave(ctx, cfg.Parallel, parallelRounds, per, ops...)
	if err != nil {
		return Throughput{}, err
	}
	t := Throughput{Goroutines: cfg.Parallel, Rounds: parallelRounds, Lock: RateOf(rounds[0])}
	if floor {
		f := RateOf(rounds[1])
		t.Floor = &f
		t.VsFloor = Ratio(rounds[0], rounds[1], PerSec)
		t.CPUVsFloor = Ratio(rounds[0], rounds[1], CPUPerCycle)
	}
	return t, nil
}
