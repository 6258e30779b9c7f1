package sqllock

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
)

// BenchmarkUncontendedBreakdown is lockctl bench's uncontended comparison
// (a new name per operation, blocks of 50 alternating, ratios taken per
// round) on a driver from Open, as users and lockctl get it, with the
// steps between the raw floor and the Client apart: the floor, the
// driver's two statements bare on its pool, the driver's cycle, the
// Client's TryAcquire and Acquire (each + Release), and TryAcquire with
// AutoRefresh(false). Besides each one's p50 over the floor's (median
// [min–max] over rounds), the process's CPU time per operation (getrusage:
// background goroutines included) over the floor's.
//
//	go test -run '^$' -bench UncontendedBreakdown -benchtime 8x ./sqllock
//
// (-benchtime counts rounds.)
func BenchmarkUncontendedBreakdown(b *testing.B) {
	table := testTable(b, adminPool(b), "")
	ctx := context.Background()
	d, err := Open(ctx, withParams(b, baseURL(b), paramTable, table))
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := d.ensureSchema(ctx); err != nil {
		b.Fatal(err)
	}
	seq := 0
	next := func(p string) string { seq++; return fmt.Sprintf("%s-%d", p, seq) }
	us := int64(6 * time.Second / time.Microsecond)
	type subject struct {
		name string
		op   func() error
	}
	raw, _ := measure.RawFloor(d)
	subjects := []subject{
		{"floor", func() error { return raw(ctx, backend.Key("bench", next("floor"))) }},
		{"stmts", func() error {
			key, token := backend.Key("bench", next("stmts")), randHex(16)
			var version int64
			if err := d.pool.QueryRow(ctx, d.sql.acquire, key, token, "", us).Scan(&version); err != nil {
				return err
			}
			var live bool
			return d.pool.QueryRow(ctx, d.sql.release, key, token, version, d.sql.channel, d.payload(key)).Scan(&live, nil)
		}},
		{"driver", func() error {
			l := backend.Claim{Key: backend.Key("bench", next("driver")), Token: randHex(16), TTL: 6 * time.Second}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		}},
		{"try", func() error {
			l, err := c.TryAcquire(ctx, next("try"))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"acquire", func() error {
			l, err := c.Acquire(ctx, next("acquire"))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"try-noauto", func() error {
			l, err := c.TryAcquire(ctx, next("noauto"), locker.AutoRefresh(false))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
	}
	const block, passes = 50, 4
	for _, s := range subjects { // warm up
		for range 10 {
			if err := s.op(); err != nil {
				b.Fatal(s.name, err)
			}
		}
	}
	n := len(subjects)
	var ratios, cpus [][]float64 = make([][]float64, n), make([][]float64, n)
	b.ResetTimer()
	for r := 0; b.Loop(); r++ {
		lat := make([][]time.Duration, n)
		cpu := make([]time.Duration, n)
		for pass := range passes {
			for k := range n {
				j := (k + r + pass) % n
				c0 := cpuNow()
				for range block {
					t := time.Now()
					if err := subjects[j].op(); err != nil {
						b.Fatal(subjects[j].name, err)
					}
					lat[j] = append(lat[j], time.Since(t))
				}
				cpu[j] += cpuNow() - c0
			}
		}
		fp := bench.Percentile(lat[0], 0.5)
		for j := range n {
			ratios[j] = append(ratios[j], float64(bench.Percentile(lat[j], 0.5))/float64(fp))
			cpus[j] = append(cpus[j], float64(cpu[j])/float64(cpu[0]))
		}
		if r == 0 {
			b.ReportMetric(float64(fp.Microseconds()), "floor-µs")
			b.ReportMetric(float64(cpu[0].Microseconds())/(block*passes), "floor-cpu-µs")
		}
	}
	b.StopTimer()
	for j := 1; j < n; j++ {
		m, lo, hi := med(ratios[j])
		cm, _, _ := med(cpus[j])
		b.Logf("%-10s p50/floor %.3f [%.3f–%.3f]  cpu/floor %.2f  (%d rounds)", subjects[j].name, m, lo, hi, cm, len(ratios[j]))
		b.ReportMetric(m, subjects[j].name+"/floor")
	}
}

func med(xs []float64) (m, lo, hi float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	m = s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return m, s[0], s[len(s)-1]
}

// cpuNow is the process's user and system CPU time so far.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
