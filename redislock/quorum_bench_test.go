package redislock

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// BenchmarkQuorumUncontended measures one acquire+release of a new name
// per operation over the five quorum servers, on one Quorum (its own
// clients), against the raw floor (floor.go: SET NX PX and a
// compare-and-delete on every server, each at the first majority), in
// alternating blocks of 50 operations, rotated so that none always follows
// the same one:
//
//	raw      the raw floor
//	driver   Quorum.TryAcquire + Quorum.Release
//	try      locker.Client.TryAcquire + Lock.Release
//	acquire  locker.Client.Acquire + Lock.Release
//
// Each round (a block of each) gives a ratio to raw; the median and the
// range over the rounds are reported.
func BenchmarkQuorumUncontended(b *testing.B) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(b, addrs...)
	ctx := context.Background()
	q, err := OpenQuorum(ctx, "redis+quorum://"+strings.Join(addrs, ",")+"/0")
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	c, err := locker.New(sharedDriver{q, q}, locker.WithNamespace("redislock-qbench"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prefix := "qbench-" + randHex(4) + "-"
	var seq int
	next := func() string { seq++; return prefix + strconv.Itoa(seq) }
	token := newToken()
	floor, _ := measure.RawFloor(q)
	raw := func() {
		if err := floor(ctx, "redislock-qbench-raw-"+next()); err != nil {
			b.Fatal(err)
		}
	}
	drv := func() {
		l := backend.Claim{Key: backend.Key("redislock-qbench", next()), Token: token, TTL: 30 * time.Second}
		if _, err := q.TryAcquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		if err := q.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	client := func(blocking bool) func() {
		acquire := c.TryAcquire
		if blocking {
			acquire = c.Acquire
		}
		return func() {
			l, err := acquire(ctx, next())
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	names := []string{"raw", "driver", "try", "acquire"}
	fns := []func(){raw, drv, client(false), client(true)}
	for range 50 {
		for _, f := range fns {
			f()
		}
	}
	const block = 50
	sums := make([]time.Duration, len(fns))
	var ratios [][]float64 = make([][]float64, len(fns))
	b.ResetTimer()
	for round := 0; round*block < b.N; round++ {
		var r [4]time.Duration
		for j := range fns {
			k := (round + j) % len(fns)
			t := time.Now()
			for range block {
				fns[k]()
			}
			r[k] = time.Since(t)
			sums[k] += r[k]
		}
		for k := range fns {
			ratios[k] = append(ratios[k], float64(r[k])/float64(r[0]))
		}
	}
	b.StopTimer()
	n := float64(len(ratios[0]) * block)
	for k, name := range names {
		b.ReportMetric(float64(sums[k].Microseconds())/n, name+"-µs")
		if k == 0 {
			continue
		}
		rs := slices.Sorted(slices.Values(ratios[k]))
		b.ReportMetric(rs[len(rs)/2], name+"/raw")
		b.ReportMetric(rs[0], name+"/raw-min")
		b.ReportMetric(rs[len(rs)-1], name+"/raw-max")
	}
	b.ReportMetric(float64(len(ratios[0])), "rounds")
	b.ReportMetric(0, "ns/op")
}
