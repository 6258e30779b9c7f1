//go:build linux

package filelock

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
)

// polling hides the driver's Queuer (and every other optional interface):
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
// 50 alternating between the raw floor (floor.go: open, flock, write,
// close; open, flock, unlink, close), the driver's TryAcquire+Release, and
// Client Acquire+Release through the Queuer (queue) and without it
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
	floor, _ := measure.RawFloor(d)
	const block = 50
	var drvR, queueR, pollR []float64
	i := 0
	for b.Loop() {
		var t [4]time.Duration
		for k := range block {
			i++
			t0 := time.Now()
			if err := floor(ctx, fmt.Sprintf("floor/%d", i)); err != nil {
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
// through the Queuer or, with poll, without it.
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
// acquisitions alternating between the queue (Queuer) and polling (the
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

// Workers in separate processes: each child (TestChild, mode "contend")
// runs 4 workers on one Client for CONTEND_DUR from CONTEND_START (Unix
// nanoseconds, so that both children overlap), through the queue or, with
// CONTEND_POLL=1, polling, and prints one line per acquisition: worker,
// then the Acquire call, its return and the Release call, in Unix
// nanoseconds (one machine, one clock).
func init() { childModes["contend"] = contendChild }

func contendChild(dir string) error {
	start, err := strconv.ParseInt(os.Getenv("CONTEND_START"), 10, 64)
	if err != nil {
		return err
	}
	dur, err := time.ParseDuration(os.Getenv("CONTEND_DUR"))
	if err != nil {
		return err
	}
	d, err := New(dir, WithSync(false))
	if err != nil {
		return err
	}
	var drv backend.Driver = d
	if os.Getenv("CONTEND_POLL") == "1" {
		drv = polling{d}
	}
	c, err := locker.New(drv, locker.WithNamespace("bench"))
	if err != nil {
		return err
	}
	defer c.Close()
	time.Sleep(time.Until(time.Unix(0, start)))
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, start).Add(dur))
	defer cancel()
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				called := time.Now()
				l, err := c.Acquire(ctx, "contended")
				if err != nil {
					continue // the run's end
				}
				got := time.Now()
				time.Sleep(time.Millisecond)
				rel := time.Now()
				mu.Lock()
				lines = append(lines, fmt.Sprintf("%d %d %d %d", w, called.UnixNano(), got.UnixNano(), rel.UnixNano()))
				mu.Unlock()
				l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(lines, "\n"))
	return nil
}

// BenchmarkContendedProcs: 8 workers in 2 processes (4 each, one Client
// per process) take one name, holding it 1ms, for 1s per run, in 5 rounds
// alternating between the queue and polling. Same quantities as the
// harness's Contention (same-process: the next holder in the releaser's
// process), from the merged per-acquisition lines, per run; the median
// over runs (and the range of fairness and wait p99). Run with
// -benchtime 1x.
func BenchmarkContendedProcs(b *testing.B) {
	type event struct {
		worker                int
		called, got, released int64
	}
	run := func(poll bool) ([]event, error) {
		dir := b.TempDir()
		start := time.Now().Add(500 * time.Millisecond).UnixNano()
		var outs [2]strings.Builder
		var cmds []*exec.Cmd
		for i := range 2 {
			cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"=contend", "FILELOCK_DIR="+dir,
				fmt.Sprint("CONTEND_START=", start), "CONTEND_DUR=1s", fmt.Sprint("CONTEND_POLL=", map[bool]int{false: 0, true: 1}[poll]))
			cmd.Stdout, cmd.Stderr = &outs[i], os.Stderr
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			cmds = append(cmds, cmd)
		}
		var evs []event
		for i, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				return nil, err
			}
			for line := range strings.Lines(outs[i].String()) {
				var e event
				if n, _ := fmt.Sscan(line, &e.worker, &e.called, &e.got, &e.released); n == 4 {
					e.worker += 4 * i
					evs = append(evs, e)
				}
			}
		}
		return evs, nil
	}
	// Per run: acq/s, handoff p50 and p99, wait p99, fairness, retakes,
	// same-process share; reported as the median over the runs, with the
	// range for fairness and wait p99.
	names := []string{"acq/s", "handoff-p50-µs", "handoff-p99-µs", "wait-p99-µs", "fairness", "retake-%", "same-process-%"}
	var figs [2][][]float64
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for range 5 {
		for m, poll := range []bool{false, true} {
			evs, err := run(poll)
			if err != nil {
				b.Fatal(err)
			}
			slices.SortFunc(evs, func(x, y event) int { return cmp.Compare(x.got, y.got) })
			var waits, handoffs []time.Duration
			var per [8]int
			retakes, same := 0, 0
			for i, e := range evs {
				waits = append(waits, time.Duration(e.got-e.called))
				per[e.worker]++
				if i == 0 {
					continue
				}
				p := evs[i-1]
				handoffs = append(handoffs, time.Duration(e.got-p.released))
				if e.worker == p.worker {
					retakes++
				}
				if e.worker/4 == p.worker/4 {
					same++
				}
			}
			lo, hi := slices.Min(per[:]), slices.Max(per[:])
			fair := float64(hi) / float64(max(lo, 1)) // a starved worker counts as 1
			n := float64(max(len(handoffs), 1))
			figs[m] = append(figs[m], []float64{
				float64(len(evs)), us(bench.Percentile(handoffs, 0.5)), us(bench.Percentile(handoffs, 0.99)),
				us(bench.Percentile(waits, 0.99)), fair, 100 * float64(retakes) / n, 100 * float64(same) / n,
			})
		}
	}
	for m, mode := range []string{"queue", "poll"} {
		for k, name := range names {
			var vs []float64
			for _, f := range figs[m] {
				vs = append(vs, f[k])
			}
			slices.Sort(vs)
			b.ReportMetric(vs[len(vs)/2], mode+"-"+name)
			if name == "fairness" || name == "wait-p99-µs" {
				b.ReportMetric(vs[0], mode+"-"+name+"-min")
				b.ReportMetric(vs[len(vs)-1], mode+"-"+name+"-max")
			}
		}
	}
}
