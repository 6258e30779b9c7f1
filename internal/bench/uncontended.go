package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testutil"
)

// The uncontended workload compares, on one Client and its driver's
// connections, a lock's acquire+release with the bare store operations it
// costs at least (its raw floor) and with the Client's other paths. Loopback
// round trips on a VM are bimodal, and the mode changes for every
// connection at once, so the subjects run in short alternating blocks,
// over several rounds, and each ratio is taken within a round.

// Subject names, in the order of Floor.Subjects.
const (
	SubjectFloor   = "floor"   // measure.RawFloor: the bare store operations
	SubjectDriver  = "driver"  // Driver.TryAcquire + Driver.Release, no Client
	SubjectAcquire = "acquire" // Client.Acquire + Lock.Release: the uncontended figure
	SubjectTry     = "try"     // Client.TryAcquire + Lock.Release on an idle Client
	// SubjectTryKept is SubjectTry while the Client holds another lock that
	// falls due first, so that the new hold does not wake the watchdog's
	// goroutine (it sleeps until the earlier one is due).
	SubjectTryKept = "try-kept"
	// SubjectNoAuto is SubjectTry with AutoRefresh(false).
	SubjectNoAuto = "try-noauto"
)

// Spread is a ratio (or share) taken in each round: its median, range and
// count of rounds.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Rounds int     `json:"rounds"`
}

func spread(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1], Rounds: len(s)}
}

// Subject is one way of taking and freeing a free lock, timed op by op.
type Subject struct {
	Name string        `json:"name"`
	Ops  int           `json:"ops"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	// VsFloor is the subject's p50 over the raw floor's p50, per round
	// (zero without a raw floor); VsDriver, over the bare driver cycle's.
	VsFloor  Spread `json:"vs_floor"`
	VsDriver Spread `json:"vs_driver"`
	// Slow is the share (0..1) of operations slower than SlowAbove, over
	// all rounds; SlowRounds, per round. Loopback round trips here are
	// bimodal, the slow mode some 3x the fast one, so an operation that
	// took a fast round trip's worth longer than its own fast time had a
	// round trip in the slow mode. SlowAbove is the subject's fast time
	// (its 5th percentile) plus that of the bare requests it makes: the
	// driver cycle's for the driver and the Client's subjects, which make
	// the same requests, the floor's for the floor. (The subject's own
	// term keeps the Client's CPU time from counting as slowness.)
	Slow       float64       `json:"slow"`
	SlowRounds Spread        `json:"slow_rounds"`
	SlowAbove  time.Duration `json:"slow_above_ns"`
	// SlowOverDriver is the subject's slow share minus the bare driver
	// cycle's, per round (paired, so that the mode's drift cancels): above
	// 0, the Client's path meets the slow mode more often than its bare
	// requests do.
	SlowOverDriver Spread `json:"slow_over_driver"`
	Errors         int    `json:"errors"`

	samples []time.Duration // every operation's time, for tests
}

// Floor is the uncontended workload's comparison.
type Floor struct {
	// Supported is false when the driver has no raw floor: the
	// ratios to it are then absent.
	Supported bool      `json:"supported"`
	Rounds    int       `json:"rounds"`
	Block     int       `json:"block_ops"`
	Subjects  []Subject `json:"subjects"`
}

// Subject returns the named subject, or nil.
func (f *Floor) Subject(name string) *Subject {
	if f == nil {
		return nil
	}
	for i := range f.Subjects {
		if f.Subjects[i].Name == name {
			return &f.Subjects[i]
		}
	}
	return nil
}

// Defaults of the uncontended comparison.
const (
	floorRounds = 7
	floorBlock  = 50
)

type subject struct {
	name string
	// block runs before and after each block (to hold a keeper lock).
	before, after func(context.Context) error
	op            func(ctx context.Context, i int) error
}

// Uncontended times acquire+release of a free lock, on a new name per
// operation, by one goroutine, interleaved with the raw floor and the
// other subjects on the same Client. It returns the acquire subject's
// figures, and the comparison.
func Uncontended(ctx context.Context, cs clients, cfg Config) (Latency, *Floor, error) {
	cfg = cfg.withDefaults()
	c, drv, err := cs.clientDriver(ctx)
	if err != nil {
		return Latency{}, nil, err
	}
	defer c.Close()
	f := &Floor{Rounds: floorRounds, Block: floorBlock}
	seq := 0
	next := func(prefix string) string { seq++; return fmt.Sprintf("%s-%d", prefix, seq) }
	ttl := cfg.TTL
	release := func(ctx context.Context, l *locker.Lock, err error) error {
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	var subjects []subject
	if raw, ok := hook(drv, measure.RawFloor); ok {
		f.Supported = true
		subjects = append(subjects, subject{name: SubjectFloor, op: func(ctx context.Context, _ int) error {
			return raw(ctx, backend.Key(cs.ns, next("floor")))
		}})
	}
	claims := make([]backend.Claim, floorBlock)
	subjects = append(subjects,
		subject{name: SubjectDriver,
			// Token and key are made before the block: a bare request.
			before: func(context.Context) error {
				for i := range claims {
					claims[i] = backend.Claim{Key: backend.Key(cs.ns, next("driver")), Token: testutil.Token(), TTL: ttl}
				}
				return nil
			},
			op: func(ctx context.Context, i int) error {
				if _, err := drv.TryAcquire(ctx, claims[i]); err != nil {
					return err
				}
				return drv.Release(ctx, claims[i])
			}},
		subject{name: SubjectAcquire, op: func(ctx context.Context, _ int) error {
			l, err := c.Acquire(ctx, next("acquire"))
			return release(ctx, l, err)
		}},
		subject{name: SubjectTry, op: func(ctx context.Context, _ int) error {
			l, err := c.TryAcquire(ctx, next("try"))
			return release(ctx, l, err)
		}},
	)
	var keeper *locker.Lock
	subjects = append(subjects,
		subject{name: SubjectTryKept,
			before: func(ctx context.Context) (err error) {
				keeper, err = c.TryAcquire(ctx, next("keeper"))
				return err
			},
			after: func(ctx context.Context) error { return keeper.Release(ctx) },
			op: func(ctx context.Context, _ int) error {
				l, err := c.TryAcquire(ctx, next("kept"))
				return release(ctx, l, err)
			}},
		subject{name: SubjectNoAuto, op: func(ctx context.Context, _ int) error {
			l, err := c.TryAcquire(ctx, next("noauto"), locker.AutoRefresh(false))
			return release(ctx, l, err)
		}},
	)

	// Warm up connections, scripts, subscriptions.
	for _, s := range subjects {
		if err := runBlock(ctx, s, 5, nil); err != nil {
			return Latency{}, nil, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	n := len(subjects)
	all := make([][]time.Duration, n)
	rounds := make([][][]time.Duration, f.Rounds) // round, subject, samples
	errs := make([]int, n)
	perRound := cfg.Duration / time.Duration(f.Rounds)
	for r := range f.Rounds {
		rounds[r] = make([][]time.Duration, n)
		rs := time.Now()
		// Every subject runs a block per pass, in an order that turns
		// each round, so that none always follows the same one.
		for pass := 0; pass == 0 || time.Since(rs) < perRound; pass++ {
			if ctx.Err() != nil {
				return Latency{}, nil, ctx.Err()
			}
			for k := range n {
				j := (k + r + pass) % n
				var lat []time.Duration
				if err := runBlock(ctx, subjects[j], floorBlock, &lat); err != nil {
					if errs[j]++; errs[j] > 10 {
						return Latency{}, nil, fmt.Errorf("%s: %w", subjects[j].name, err)
					}
				}
				rounds[r][j] = append(rounds[r][j], lat...)
				all[j] = append(all[j], lat...)
			}
		}
	}
	drvIdx := slices.IndexFunc(subjects, func(s subject) bool { return s.name == SubjectDriver })
	for j, s := range subjects {
		fast := all[drvIdx]
		if s.name == SubjectFloor {
			fast = all[j]
		}
		above := Percentile(fast, 0.05) + Percentile(all[j], 0.05)
		sub := Subject{Name: s.name, Ops: len(all[j]), P50: Percentile(all[j], 0.5), P90: Percentile(all[j], 0.9),
			P99: Percentile(all[j], 0.99), Slow: slowShare(all[j], above), SlowAbove: above, Errors: errs[j], samples: all[j]}
		var vsFloor, vsDriver, slow, slowOver []float64
		for r := range rounds {
			p := Percentile(rounds[r][j], 0.5)
			if p <= 0 {
				continue
			}
			if f.Supported {
				if fp := Percentile(rounds[r][0], 0.5); fp > 0 {
					vsFloor = append(vsFloor, float64(p)/float64(fp))
				}
			}
			if dp := Percentile(rounds[r][drvIdx], 0.5); dp > 0 {
				vsDriver = append(vsDriver, float64(p)/float64(dp))
			}
			slow = append(slow, slowShare(rounds[r][j], above))
			if s.name != SubjectFloor {
				slowOver = append(slowOver, slowShare(rounds[r][j], above)-slowShare(rounds[r][drvIdx], above))
			}
		}
		sub.VsFloor, sub.VsDriver, sub.SlowRounds, sub.SlowOverDriver = spread(vsFloor), spread(vsDriver), spread(slow), spread(slowOver)
		f.Subjects = append(f.Subjects, sub)
	}
	acq := slices.IndexFunc(subjects, func(s subject) bool { return s.name == SubjectAcquire })
	// Its rate is over the time its own operations took.
	var busy time.Duration
	for _, d := range all[acq] {
		busy += d
	}
	return summarize(all[acq], busy, errs[acq]), f, nil
}

// runBlock runs ops operations of s, appending each one's time to lat if
// it is not nil. It stops at the first error.
func runBlock(ctx context.Context, s subject, ops int, lat *[]time.Duration) (err error) {
	if s.before != nil {
		if err := s.before(ctx); err != nil {
			return err
		}
	}
	if s.after != nil {
		defer func() {
			if aerr := s.after(ctx); err == nil {
				err = aerr
			}
		}()
	}
	for i := range ops {
		t := time.Now()
		if err := s.op(ctx, i); err != nil {
			return err
		}
		if lat != nil {
			*lat = append(*lat, time.Since(t))
		}
	}
	return nil
}

func slowShare(ds []time.Duration, above time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	n := 0
	for _, d := range ds {
		if d > above {
			n++
		}
	}
	return float64(n) / float64(len(ds))
}
