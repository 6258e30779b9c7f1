//go:build linux

package filelock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
)

// polling hides the driver's Waiter (and every other optional interface):
// the locker package then polls with its backoff, as before the queue.
type polling struct{ backend.Driver }

// ratios reports the median and range of per-block ratios.
func ratios(b *testing.B, name string, rs []float64) {
	if len(rs) == 0 {
		return
	}
	slices.Sort(rs)
	b.ReportMetric(rs[len(rs)/2], name)
	b.ReportMetric(rs[0], name+"-min")
	b.ReportMetric(rs[len(rs)-1], name+"-max")
}

// BenchmarkUncontended: one worker, a new name per operation, in blocks of
// 50 alternating between the raw floor (RawFloor: open, flock, write,
// close; open, flock, unlink, close), the driver's TryAcquire+Release, and
// Client Acquire+Release through the Waiter (queue) and without it
// (polling: the path before the queue), on one directory. Metrics: the
// median (and range) of the per-round ratios.
func BenchmarkUncontended(b *testing.B) {
	d, err := New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	queue, err := locker.New(d, locker.WithNamespace("q"))
	if err != nil {
		b.Fatal(err)
	}
	defer queue.Close()
	poll, err := locker.New(polling{d}, locker.WithNamespace("p"))
	if err != nil {
		b.Fatal(err)
	}
	defer poll.Close()
	const block = 50
	var drvR, queueR, pollR []float64
	i := 0
	for b.Loop() {
		var t [4]time.Duration
		for k := range block {
			i++
			t0 := time.Now()
			if err := d.RawFloor(ctx, fmt.Sprintf("floor/%d", i)); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			l := backend.Claim{Key: fmt.Sprintf("drv/%d", i), Token: "tok", TTL: time.Minute}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			// Alternate which client goes first.
			cs := []*locker.Client{queue, poll}
			if k%2 == 1 {
				cs[0], cs[1] = poll, queue
			}
			var ts [2]time.Duration
			for j, c := range cs {
				s := time.Now()
				lk, err := c.Acquire(ctx, fmt.Sprintf("c/%d", i))
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(ctx); err != nil {
					b.Fatal(err)
				}
				ts[j] = time.Since(s)
			}
			if k%2 == 1 {
				ts[0], ts[1] = ts[1], ts[0]
			}
			t[0] += t1.Sub(t0)
			t[1] += t2.Sub(t1)
			t[2] += ts[0]
			t[3] += ts[1]
		}
		drvR = append(drvR, float64(t[1])/float64(t[0]))
		queueR = append(queueR, float64(t[2])/float64(t[0]))
		pollR = append(pollR, float64(t[3])/float64(t[0]))
	}
	ratios(b, "drv/floor", drvR)
	ratios(b, "queue/floor", queueR)
	ratios(b, "poll/floor", pollR)
	qp := make([]float64, len(queueR))
	for i := range queueR {
		qp[i] = queueR[i] / pollR[i]
	}
	ratios(b, "queue/poll", qp)
}

// contenders returns 8 workers on 2 clients (each its own Driver on dir,
// so they share no flock state: flocks belong to open file descriptions),
// through the Waiter or, with poll, without it.
func contenders(b *testing.B, dir string, poll bool) ([]bench.Worker, func()) {
	var ws []bench.Worker
	var cs []*locker.Client
	for i := range 2 {
		d, err := New(dir, WithSync(false))
		if err != nil {
			b.Fatal(err)
		}
		var drv backend.Driver = d
		if poll {
			drv = polling{d}
		}
		c, err := locker.New(drv, locker.WithNamespace("bench"))
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
		for range 4 {
			ws = append(ws, bench.Worker{Client: i, Acquire: bench.ClientAcquirer(c, "contended")})
		}
	}
	return ws, func() {
		for _, c := range cs {
			c.Close()
		}
	}
}

// BenchmarkContended: 8 workers on 2 clients take one name in turn, each
// holding it 1ms (internal/bench's harness), in rounds of 200
// acquisitions alternating between the queue (Waiter) and polling (the
// locker package's backoff, as before the queue). Metrics prefixed queue-
// and poll-.
func BenchmarkContended(b *testing.B) {
	dir := b.TempDir()
	var q, p bench.Samples
	const round = 200
	for n := 0; n < b.N; n += round {
		for _, poll := range []bool{false, true} {
			ws, done := contenders(b, dir, poll)
			s, err := bench.Contend{Workers: ws, Hold: time.Millisecond, Acquisitions: min(round, b.N-n)}.Run(context.Background())
			done()
			if err != nil {
				b.Fatal(err)
			}
			if poll {
				p.Add(s)
			} else {
				q.Add(s)
			}
		}
	}
	q.Summary().Report(b, "queue")
	p.Summary().Report(b, "poll")
}
