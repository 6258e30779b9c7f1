package pglock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

func benchPool(b *testing.B, admin *pgxpool.Pool) (*pgxpool.Pool, *Driver) {
	b.Helper()
	ctx := context.Background()
	table := testTable(b, admin, "")
	pool, err := pgxpool.New(ctx, baseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	d, err := New(pool, WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	if err := d.ensureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	return pool, d
}

// BenchmarkUncontended measures acquire+release of a free lock, against the
// floor: the same two statements through the same pool, interleaved in one
// run so that the ratio is not skewed by a busy machine.
func BenchmarkUncontended(b *testing.B) {
	admin := adminPool(b)
	pool, d := benchPool(b, admin)
	ctx := context.Background()
	c, err := locker.New(d, locker.WithNamespace("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	key := backend.Key("bench", "u")
	us := int64(30 * time.Second / time.Microsecond)

	var rawCtx func(context.Context)
	raw := func() { rawCtx(ctx) }
	rawCtx = func(ctx context.Context) {
		token := randHex(16)
		var version int64
		if err := pool.QueryRow(ctx, d.sql.acquire, key, token, "", us).Scan(&version); err != nil {
			b.Fatal(err)
		}
		var live bool
		if err := pool.QueryRow(ctx, d.sql.release, key, token, version, d.sql.channel).Scan(&live); err != nil {
			b.Fatal(err)
		}
	}
	driver := func() {
		l := backend.Claim{Key: key, Token: randHex(16), TTL: 30 * time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			b.Fatal(err)
		}
		l.Fence = g.Fence
		if err := d.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	client := func() {
		l, err := c.TryAcquire(ctx, "u")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	blocking := func() {
		l, err := c.Acquire(ctx, "u")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// The Client passes pgx a cancellable context (it ends when the Client
	// closes), for which pgx watches each query in a goroutine; so does any
	// caller with a request context. This is that floor.
	rawCancel := func() {
		ctx, cancel := context.WithCancel(ctx)
		rawCtx(ctx)
		cancel()
	}
	fs := []func(){raw, driver, client, blocking, rawCancel}
	names := []string{"raw", "driver", "client", "client-acquire", "raw-cancellable"}
	for _, f := range fs { // warm up: prepared statements, listener
		for range 20 {
			f()
		}
	}
	// Medians, not means: other tests share the machine and the server,
	// and a stall should not count against whichever variant it hit.
	samples := make([][]time.Duration, len(fs))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range fs {
			k := (i + j) % len(fs) // rotate the order
			start := time.Now()
			fs[k]()
			samples[k] = append(samples[k], time.Since(start))
		}
	}
	med := make([]time.Duration, len(fs))
	for k, name := range names {
		med[k] = median(samples[k])
		b.ReportMetric(float64(med[k].Microseconds()), name+"-µs")
	}
	for k := 1; k < len(fs); k++ {
		b.ReportMetric(float64(med[k])/float64(med[0]), names[k]+"/raw")
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkContendedHandoff runs 8 workers, each with its own Client and
// driver (so its own pool and listener, as separate processes would), on
// one name, and measures the handoff: from the holder's Release until the
// next holder's Acquire returns. It compares the median with the median
// round trip of one statement (the acquire statement on a free lock).
func BenchmarkContendedHandoff(b *testing.B) {
	admin := adminPool(b)
	pool, d0 := benchPool(b, admin)
	ctx := context.Background()
	const workers = 8
	clients := make([]*locker.Client, workers)
	for i := range workers {
		// Each worker gets a pool of its own.
		p, err := pgxpool.New(ctx, baseURL(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		d, err := New(p, WithTable(d0.cfg.table))
		if err != nil {
			b.Fatal(err)
		}
		clients[i], err = locker.New(d, locker.WithNamespace("bench"))
		if err != nil {
			b.Fatal(err)
		}
		defer clients[i].Close()
	}

	// The round trip of one statement: the acquire statement on a free
	// lock, measured before and after the run (the machine is shared).
	us := int64(30 * time.Second / time.Microsecond)
	var rtts []time.Duration
	measureRTT := func() {
		for i := range 220 {
			token := randHex(16)
			start := time.Now()
			var version int64
			if err := pool.QueryRow(ctx, d0.sql.acquire, "bench/rtt", token, "", us).Scan(&version); err != nil {
				b.Fatal(err)
			}
			if i >= 20 {
				rtts = append(rtts, time.Since(start))
			}
			var live bool
			if err := pool.QueryRow(ctx, d0.sql.release, "bench/rtt", token, version, d0.sql.channel).Scan(&live); err != nil {
				b.Fatal(err)
			}
		}
	}
	measureRTT()

	var (
		mu          sync.Mutex
		handoffs    []time.Duration // from the start of the previous Release
		afterEnd    []time.Duration // from the end of the previous Release
		releases    []time.Duration // how long Release took
		lastStart   time.Time
		lastHolder  int
		same, other []time.Duration
		lastEnd     time.Time
		count       atomic.Int64
		wg          sync.WaitGroup
		failed      atomic.Value
		target      = int64(b.N) + 8
	)
	b.ResetTimer()
	for w := range workers {
		wg.Go(func() {
			for count.Load() < target {
				l, err := clients[w].Acquire(ctx, "h")
				if err != nil {
					failed.Store(err)
					return
				}
				got := time.Now()
				mu.Lock()
				if !lastStart.IsZero() && count.Load() >= 8 { // skip the start-up
					handoffs = append(handoffs, got.Sub(lastStart))
					if lastHolder == w {
						same = append(same, got.Sub(lastStart))
					} else {
						other = append(other, got.Sub(lastStart))
					}
					afterEnd = append(afterEnd, got.Sub(lastEnd))
				}
				mu.Unlock()
				count.Add(1)
				start := time.Now()
				mu.Lock()
				lastStart = start
				lastHolder = w
				lastEnd = time.Time{}
				mu.Unlock()
				err = l.Release(ctx)
				end := time.Now()
				mu.Lock()
				releases = append(releases, end.Sub(start))
				if lastStart == start {
					lastEnd = end
				}
				mu.Unlock()
				if err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	measureRTT()
	// A handoff whose release had not returned when the next holder got
	// the lock has no "after end" figure.
	var ends []time.Duration
	for _, d := range afterEnd {
		if d > 0 && d < time.Hour {
			ends = append(ends, d)
		}
	}
	rtt, h, he := median(rtts), median(handoffs), median(ends)
	b.ReportMetric(float64(rtt.Microseconds()), "rtt-µs")
	// How often the releasing worker took the lock back (barging, it was
	// not waiting), and the median handoffs to itself and to a waiter
	// woken by NOTIFY.
	b.ReportMetric(float64(len(same))/float64(len(same)+len(other)), "barging")
	b.ReportMetric(float64(median(same).Microseconds()), "to-self-µs")
	b.ReportMetric(float64(median(other).Microseconds()), "to-waiter-µs")
	b.ReportMetric(float64(median(releases).Microseconds()), "release-µs")
	b.ReportMetric(float64(h.Microseconds()), "handoff-median-µs")
	b.ReportMetric(float64(h)/float64(rtt), "handoff/rtt")
	b.ReportMetric(float64(he)/float64(rtt), "handoff-after-release/rtt")
}
