package bench

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
)

// Semaphore summarizes the semaphore workload: SemWorkers workers spread
// over Clients clients share one semaphore of SemLimit permits, each
// acquiring and releasing a permit in a loop; and one goroutine times a
// permit's acquire+release against a lock's, interleaved on one client,
// so that the ratio compares the two on the same connections and moment.
type Semaphore struct {
	Limit      int           `json:"limit"`
	Workers    int           `json:"workers"`
	PermitsSec float64       `json:"permits_per_sec"` // each permit held semHold
	WaitP99    time.Duration `json:"wait_p99_ns"`
	// MaxInside is the most holders at once that the workers counted:
	// never more than Limit.
	MaxInside int `json:"max_inside"`
	// PermitP50 and LockP50 are uncontended acquire+release of a permit
	// and of a lock; Ratio is PermitP50 / LockP50.
	PermitP50   time.Duration `json:"permit_p50_ns"`
	LockP50     time.Duration `json:"lock_p50_ns"`
	Ratio       float64       `json:"ratio"`
	Errors      int           `json:"errors"`
	Unsupported bool          `json:"unsupported,omitempty"`
	// WeightedSec and MostPermits are the contended workers again, for
	// half as long, every other one taking 2 permits at once
	// (locker.Permits): acquisitions per second, and the most permits
	// held at once, never more than Limit. NoWeights: the backend takes
	// one permit per claim.
	WeightedSec float64 `json:"weighted_per_sec,omitempty"`
	MostPermits int     `json:"most_permits,omitempty"`
	NoWeights   bool    `json:"no_weights,omitempty"`
}

// semHold is how long a worker keeps its permit: some work, so that
// holders overlap and MaxInside means something.
const semHold = 100 * time.Microsecond

// RunSemaphore runs the semaphore workload.
func RunSemaphore(ctx context.Context, cs clients, cfg Config) (Semaphore, error) {
	cfg = cfg.withDefaults()
	r := Semaphore{Limit: cfg.SemLimit, Workers: cfg.SemWorkers}
	sem := locker.Semaphore(cfg.SemLimit)
	var clients []*locker.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range cfg.Clients {
		c, err := cs.client(ctx)
		if err != nil {
			return r, err
		}
		clients = append(clients, c)
	}
	if l, err := clients[0].TryAcquire(ctx, "semaphore", sem); errors.Is(err, locker.ErrUnsupported) {
		r.Unsupported = true
		return r, nil
	} else if err != nil {
		return r, err
	} else if err := l.Release(ctx); err != nil {
		return r, err
	}

	// Permit against lock, alternating in small batches.
	var permit, lock []time.Duration
	start := time.Now()
	for time.Since(start) < cfg.Duration/2 && ctx.Err() == nil {
		for i := range 40 {
			opts := []locker.LockOption{sem}
			name, into := "semaphore-ratio", &permit
			if i%2 == 1 {
				opts, name, into = nil, "lock-ratio", &lock
			}
			t := time.Now()
			l, err := clients[0].Acquire(ctx, name, opts...)
			if err == nil {
				err = l.Release(ctx)
			}
			if err != nil {
				if r.Errors++; r.Errors > 100 {
					return r, err
				}
				continue
			}
			*into = append(*into, time.Since(t))
		}
	}
	r.PermitP50, r.LockP50 = Percentile(permit, 0.5), Percentile(lock, 0.5)
	if r.LockP50 > 0 {
		r.Ratio = float64(r.PermitP50) / float64(r.LockP50)
	}

	// Contended: workers share the semaphore.
	rate, waits, most, errs := contend(ctx, clients, cfg, cfg.Duration, func(int) int { return 1 })
	r.PermitsSec = rate
	r.WaitP99 = Percentile(waits, 0.99)
	r.MaxInside = most
	r.Errors += errs
	if cfg.SemLimit < 2 {
		return r, nil
	}
	l, err := clients[0].TryAcquire(ctx, "semaphore", sem, locker.Permits(2))
	switch {
	case errors.Is(err, locker.ErrUnsupported):
		r.NoWeights = true
		return r, nil
	case err != nil:
		return r, err
	case l.Release(ctx) != nil:
		r.Errors++
	}
	rate, _, most, errs = contend(ctx, clients, cfg, cfg.Duration/2, func(w int) int { return 1 + w%2 })
	r.WeightedSec = rate
	r.MostPermits = most
	r.Errors += errs
	return r, nil
}

// contend runs cfg.SemWorkers workers on clients for d, worker w taking
// weight(w) permits of the semaphore in a loop, and returns their
// acquisitions per second, their waits, the most permits they counted
// held at once, and their errors.
func contend(ctx context.Context, clients []*locker.Client, cfg Config, d time.Duration, weight func(int) int) (float64, []time.Duration, int, int) {
	var inside, most atomic.Int64
	var mu sync.Mutex
	var waits []time.Duration
	var errs atomic.Int64
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for w := range cfg.SemWorkers {
		c := clients[w%len(clients)]
		k := weight(w)
		opts := []locker.LockOption{locker.Semaphore(cfg.SemLimit), locker.Permits(k)}
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); waits = append(waits, mine...); mu.Unlock() }()
			for time.Since(start) < d && wctx.Err() == nil {
				t := time.Now()
				l, err := c.Acquire(wctx, "semaphore", opts...)
				if err != nil {
					if wctx.Err() == nil && errs.Add(1) > 100 {
						cancel()
					}
					continue
				}
				mine = append(mine, time.Since(t))
				n := inside.Add(int64(k))
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(semHold)
				inside.Add(-int64(k))
				if l.Release(ctx) != nil {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(len(waits)) / time.Since(start).Seconds(), waits, int(most.Load()), int(errs.Load())
}
