package faults

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/history"
)

var soak = flag.Duration("faults.soak", 0, "run TestSoak: the random fault schedule for this long per backend")

// defaultRandomRun is how long the random schedule runs per backend in the
// default (CI) run.
const defaultRandomRun = 6 * time.Second

// randomStats is what one random run did.
type randomStats struct {
	faults   int
	history  history.Result
	closeMax time.Duration
}

// randomSchedule runs 4 clients x 4 goroutines on 3 names for d while one
// goroutine injects a random fault at a time: a client blackholed, delayed
// or cut, one of a client's paths blackholed, a server paused. Every
// acquisition goes into the history, which must show no violation.
func randomSchedule(t *testing.T, e *env, d time.Duration) randomStats {
	const nClients, nWorkers = 4, 4
	names := []string{uniqueName("rnd"), uniqueName("rnd"), uniqueName("rnd")}
	var cls []*client
	for i := 0; i < nClients; i++ {
		cls = append(cls, e.newClient(nil))
	}
	ttl := e.spec.ttl
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acquired, failed atomic.Int64
	for _, cl := range cls {
		for g := 0; g < nWorkers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pprof.SetGoroutineLabels(cl.labels)
				worker(cl, fmt.Sprintf("/g%d", g), names, ttl, stop, &acquired, &failed)
			}()
		}
	}
	var faults int
	var faultLog []string
	start := time.Now()
	for time.Since(start) < d {
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		desc := injectOne(e, cls, ttl)
		faults++
		faultLog = append(faultLog, fmt.Sprintf("+%v %s", time.Since(start).Round(time.Millisecond), desc))
	}
	close(stop)
	for _, cl := range cls {
		cl.heal()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("workers still busy 30 s after the schedule ended")
	}
	st := randomStats{faults: faults}
	st.history = e.check()
	if !st.history.OK() {
		t.Logf("faults injected:\n%v", faultLog)
	}
	for _, cl := range cls {
		cl.close()
		st.closeMax = max(st.closeMax, cl.closeTook)
	}
	if st.closeMax > closeBound {
		t.Errorf("a Close took %v after the schedule, bound %v", st.closeMax.Round(time.Millisecond), closeBound)
	}
	t.Logf("%s: %v, %d faults, %d acquisitions (%d failed attempts), %d violations, slowest Close %v",
		e.spec.name, d, faults, st.history.Acquired, failed.Load(), len(st.history.Violations), st.closeMax.Round(time.Millisecond))
	return st
}

// worker acquires, holds a while and releases, until stop.
func worker(cl *client, who string, names []string, ttl time.Duration, stop <-chan struct{}, acquired, failed *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		name := names[rand.IntN(len(names))]
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+rand.IntN(int(2*ttl/time.Millisecond)))*time.Millisecond)
		hd, err := cl.acquire(ctx, name, who, rand.IntN(10) < 7)
		cancel()
		if err != nil {
			failed.Add(1)
			time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
			continue
		}
		acquired.Add(1)
		select {
		case <-time.After(time.Duration(rand.IntN(int(ttl/2/time.Millisecond)+1)) * time.Millisecond):
		case <-hd.l.Lost():
		case <-stop:
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		hd.release(rctx)
		rcancel()
	}
}

// injectOne applies one random fault, waits for it to play out, and heals.
func injectOne(e *env, cls []*client, ttl time.Duration) string {
	cl := cls[rand.IntN(len(cls))]
	dur := time.Duration(int64(ttl)/2 + rand.Int64N(int64(ttl)*3/2))
	switch k := rand.IntN(6); k {
	case 0, 1:
		cl.blackhole()
		time.Sleep(dur)
		cl.heal()
		return fmt.Sprintf("%s blackholed %v", cl.id, dur.Round(time.Millisecond))
	case 2:
		up, down := time.Duration(rand.IntN(80))*time.Millisecond, time.Duration(rand.IntN(80))*time.Millisecond
		cl.delay(up, down)
		time.Sleep(dur)
		cl.heal()
		return fmt.Sprintf("%s delayed %v/%v for %v", cl.id, up, down, dur.Round(time.Millisecond))
	case 3:
		cl.cut()
		return fmt.Sprintf("%s cut", cl.id)
	case 4:
		i := rand.IntN(len(cl.proxies))
		cl.proxies[i].Blackhole()
		time.Sleep(dur)
		cl.proxies[i].Heal()
		return fmt.Sprintf("%s path %d blackholed %v", cl.id, i, dur.Round(time.Millisecond))
	default:
		s := e.servers[rand.IntN(len(e.servers))]
		if err := s.Pause(); err != nil {
			return "pause failed: " + err.Error()
		}
		time.Sleep(dur)
		if err := s.Resume(); err != nil {
			return "resume failed: " + err.Error()
		}
		return fmt.Sprintf("%s paused %v", s.Name, dur.Round(time.Millisecond))
	}
}

// TestSoak runs the random schedule for -faults.soak per backend and
// prints what it checked. Without the flag it does nothing.
func TestSoak(t *testing.T) {
	if *soak <= 0 {
		t.Skip("the soak runs with -faults.soak=DURATION")
	}
	var mu sync.Mutex
	summary := map[string]randomStats{}
	t.Cleanup(func() {
		for _, sp := range specs() {
			if st, ok := summary[sp.name]; ok {
				fmt.Printf("soak %-13s %v: faults %4d, acquisitions checked %6d, violations %d, slowest Close %v\n",
					sp.name, *soak, st.faults, st.history.Acquired, len(st.history.Violations), st.closeMax.Round(time.Millisecond))
			}
		}
	})
	for _, sp := range specs() {
		t.Run(sp.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, sp, sp.start(t))
			st := randomSchedule(t, e, *soak)
			mu.Lock()
			summary[sp.name] = st
			mu.Unlock()
		})
	}
}
