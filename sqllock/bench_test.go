package sqllock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
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
// floor (floor.go: the bare INSERT ... ON CONFLICT DO NOTHING and DELETE)
// and against the driver's own two statements, all through the same pool,
// interleaved in one run so that the ratio is not skewed by a busy machine.
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
		if err := pool.QueryRow(ctx, d.sql.release, key, token, version, d.sql.channel, d.payload(key)).Scan(&live, nil); err != nil {
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
	// The floor: the bare INSERT ... ON CONFLICT DO NOTHING and DELETE.
	floorKey := backend.Key("bench-floor", "u")
	rawFloor, _ := measure.RawFloor(d)
	floor := func() {
		if err := rawFloor(ctx, floorKey); err != nil {
			b.Fatal(err)
		}
	}
	fs := []func(){floor, raw, driver, client, blocking, rawCancel}
	names := []string{"floor", "stmts", "driver", "client", "client-acquire", "stmts-cancellable"}
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
		med[k] = bench.Percentile(samples[k], 0.5)
		b.ReportMetric(float64(med[k].Microseconds()), name+"-µs")
	}
	for k := 1; k < len(fs); k++ {
		b.ReportMetric(float64(med[k])/float64(med[0]), names[k]+"/floor")
	}
}

// BenchmarkContended runs 8 workers on one name, each holding it 1ms,
// through the contended harness (internal/bench): over 2 clients (the
// issue's shape: 4 workers share a Client, a driver and its pool), and
// over 8 (one each, as separate processes would): only the first waiter
// of each Client tries, woken by release notifications. The round trip is
// SELECT 1 on the first client's pool, during the run.
//
//	go test -run '^$' -bench Contended -benchtime 1200x -count 5 ./sqllock
func BenchmarkContended(b *testing.B) {
	for _, clients := range []int{2, 8} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) { benchContended(b, clients) })
	}
}

func benchContended(b *testing.B, clients int) {
	admin := adminPool(b)
	_, d0 := benchPool(b, admin)
	ctx := context.Background()
	const workers, rounds = 8, 6
	contender := func(name string) bench.Contend {
		run := bench.Contend{Hold: time.Millisecond, Acquisitions: max(b.N/rounds, 1), RoundTripOp: "SELECT 1"}
		cs := make([]*locker.Client, clients)
		for i := range clients {
			p, err := pgxpool.New(ctx, baseURL(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			d, err := New(p, WithTable(d0.cfg.table))
			if err != nil {
				b.Fatal(err)
			}
			c, err := locker.New(d, locker.WithNamespace("bench"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			// Warm up: the pool's connection, prepared statements, the listener.
			l, err := c.Acquire(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			l.Release(ctx)
			if i == 0 {
				run.RoundTrip = func(ctx context.Context) error {
					_, err := p.Exec(ctx, "SELECT 1")
					return err
				}
			}
			cs[i] = c
		}
		for w := range workers {
			run.Workers = append(run.Workers, bench.Worker{Client: w % clients, Acquire: bench.ClientAcquirer(cs[w%clients], name)})
		}
		return run
	}
	runs := []bench.Contend{contender("contend")}
	names := []string{"contend"}
	samples := make([]*bench.Samples, len(runs))
	b.ResetTimer()
	for r := range rounds {
		for j := range runs {
			k := (r + j) % len(runs)
			s, err := runs[k].Run(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if samples[k] == nil {
				samples[k] = s
			} else {
				samples[k].Add(s)
			}
		}
	}
	b.StopTimer()
	for k, name := range names {
		samples[k].Summary().Report(b, name)
	}
}

// BenchmarkSemaphoreVsLock times a permit's acquire+release against a
// lock's, interleaved op by op on one Client (as internal/bench's
// semaphore workload does) and on its driver, each on a name of its own.
//
//	go test -run '^$' -bench SemaphoreVsLock -benchtime 2000x -count 5 ./sqllock
func BenchmarkSemaphoreVsLock(b *testing.B) {
	admin := adminPool(b)
	_, d := benchPool(b, admin)
	ctx := context.Background()
	c, err := locker.New(d, locker.WithNamespace("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sem := locker.Semaphore(4)
	client := func(name string, opts ...locker.LockOption) func() {
		return func() {
			l, err := c.Acquire(ctx, name, opts...)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	driver := func(claim func() backend.Claim) func() {
		return func() {
			c := claim()
			g, err := d.TryAcquire(ctx, c)
			if err != nil {
				b.Fatal(err)
			}
			c.Fence = g.Fence
			if err := d.Release(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
	}
	// As before grants ran without a transaction of their own: in an
	// explicit one, BEGIN and COMMIT in the pipeline.
	explicit := func(f func()) func() {
		return func() {
			d.explicitGrant.Store(true)
			f()
			d.explicitGrant.Store(false)
		}
	}
	fs := []func(){
		client("lock-ratio"),
		client("semaphore-ratio", sem),
		explicit(client("semaphore-ratio", sem)),
		driver(func() backend.Claim {
			return backend.Claim{Key: "bench/lock", Token: randHex(16), TTL: 30 * time.Second}
		}),
		driver(func() backend.Claim {
			return backend.Claim{Key: "bench/sem", Token: randHex(16), TTL: 30 * time.Second, Mode: backend.Permit, Limit: 4}
		}),
	}
	names := []string{"lock", "permit", "permit-explicit", "driver-lock", "driver-permit"}
	for _, f := range fs { // warm up: prepared statements
		for range 20 {
			f()
		}
	}
	samples := make([][]time.Duration, len(fs))
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
		med[k] = bench.Percentile(samples[k], 0.5)
		b.ReportMetric(float64(med[k].Microseconds()), name+"-µs")
	}
	b.ReportMetric(float64(med[1])/float64(med[0]), "permit/lock")
	b.ReportMetric(float64(med[2])/float64(med[0]), "permit-explicit/lock")
	b.ReportMetric(float64(med[4])/float64(med[3]), "driver-permit/lock")
}
