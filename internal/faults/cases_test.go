package faults

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// lostSlack is the scheduling slack allowed past a hold's local deadline
// (send time of its last confirmation + TTL - ClockMargin) for the lost
// signal to be observed, on a busy 2-core machine under -race.
const lostSlack = 300 * time.Millisecond

// cancelBound is the test's bound for Acquire to return after its context
// is cancelled on a dead connection (the contract: 100 ms + one round trip).
const cancelBound = 500 * time.Millisecond

// closeBound is the test's bound for Close of a cut-off client.
const closeBound = 3 * time.Second

var nameSeq atomic.Int64

func uniqueName(base string) string { return fmt.Sprintf("%s-%d", base, nameSeq.Add(1)) }

// TestFaults runs every case on every backend, each backend on private
// servers of its own, the backends in parallel.
func TestFaults(t *testing.T) {
	for _, sp := range specs() {
		t.Run(sp.name, func(t *testing.T) {
			t.Parallel()
			servers := sp.start(t)
			for _, c := range cases(sp) {
				t.Run(c.name, func(t *testing.T) {
					skipKnown(t, sp.name, c.name)
					c.run(t, newEnv(t, sp, servers))
				})
			}
		})
	}
}

type faultCase struct {
	name string
	run  func(t *testing.T, e *env)
}

// cases are the cases that apply to a backend.
func cases(sp spec) []faultCase {
	cs := []faultCase{
		{"holder-blackholed", func(t *testing.T, e *env) { holderCutOff(t, e, allProxies, true) }},
		{"latency-no-spurious-loss", latency},
		{"waiter-cut-off-cancelled", waiterCancelled},
		{"close-while-cut-off", closeCutOff},
	}
	switch sp.name {
	case "redis-quorum":
		cs = append(cs,
			faultCase{"minority-blackholed", func(t *testing.T, e *env) { holderCutOff(t, e, firstProxies(2), false) }},
			faultCase{"majority-blackholed", func(t *testing.T, e *env) { holderCutOff(t, e, firstProxies(3), true) }},
			faultCase{"majority-paused", func(t *testing.T, e *env) {
				serverPaused(t, e, func(*client) []*testenv.Server { return e.servers[:3] }, true)
			}},
		)
	case "etcd-cluster":
		cs = append(cs, faultCase{"leader-isolated", func(t *testing.T, e *env) { serverPaused(t, e, etcdLeader, false) }})
	case "zk-ensemble":
		cs = append(cs,
			faultCase{"clients-server-isolated", func(t *testing.T, e *env) { holderCutOff(t, e, connectedProxies, false) }},
			faultCase{"clients-server-paused", func(t *testing.T, e *env) { serverPaused(t, e, connectedServer, false) }},
		)
	default: // one server
		cs = append(cs,
			faultCase{"server-paused", func(t *testing.T, e *env) {
				serverPaused(t, e, func(*client) []*testenv.Server { return e.servers }, true)
			}},
			faultCase{"server-restarted", serverRestarted},
		)
	}
	cs = append(cs, faultCase{"random", func(t *testing.T, e *env) { randomSchedule(t, e, defaultRandomRun) }})
	return cs
}

// Which of a client's proxies a fault hits.
type proxyPick func(e *env, cl *client) []*faultproxy.Proxy

func allProxies(_ *env, cl *client) []*faultproxy.Proxy { return cl.proxies }

func firstProxies(n int) proxyPick {
	return func(_ *env, cl *client) []*faultproxy.Proxy { return cl.proxies[:n] }
}

// connectedProxies are the proxies on which the client has a connection
// open: the server it talks to.
func connectedProxies(_ *env, cl *client) []*faultproxy.Proxy {
	var out []*faultproxy.Proxy
	for _, p := range cl.proxies {
		if p.Conns() > 0 {
			out = append(out, p)
		}
	}
	return out
}

func connectedServer(cl *client) []*testenv.Server {
	var out []*testenv.Server
	for i, p := range cl.proxies {
		if p.Conns() > 0 {
			out = append(out, cl.e.servers[i])
		}
	}
	return out
}

// mustHold takes name for cl within 10 s or fails the test.
func mustHold(t *testing.T, cl *client, name string) *held {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hd, err := cl.acquire(ctx, name, "", true)
	if err != nil {
		t.Fatalf("%s: acquire %s: %v", cl.id, name, err)
	}
	return hd
}

// waiterResult is what a background Acquire returned.
type waiterResult struct {
	hd  *held
	err error
	at  time.Time
}

// waitFor starts an Acquire of name by cl bounded by d.
func waitFor(cl *client, name string, d time.Duration) <-chan waiterResult {
	ch := make(chan waiterResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		hd, err := cl.acquire(ctx, name, "", true)
		ch <- waiterResult{hd, err, time.Now()}
	}()
	return ch
}

// checkLostBound checks that the lost signal fired no later than the local
// deadline of a hold last confirmed before t0.
func checkLostBound(t *testing.T, hd *held, t0 time.Time, what string) {
	t.Helper()
	ttl := hd.l.TTL()
	deadline := ttl - backend.ClockMargin(ttl)
	lostAt, ok := hd.waitLost(deadline + 3*time.Second)
	if !ok {
		t.Errorf("%s: no lost signal %v after %s (local deadline %v after it, TTL %v)", hd.cl.id, deadline+3*time.Second, what, deadline, ttl)
		return
	}
	took := lostAt.Sub(t0)
	t.Logf("%s: lost signal %v after %s (local deadline %v, TTL %v)", hd.cl.id, took.Round(time.Millisecond), what, deadline, ttl)
	if took > deadline+lostSlack {
		t.Errorf("%s: lost signal %v after %s, past the local deadline %v + %v slack", hd.cl.id, took.Round(time.Millisecond), what, deadline, lostSlack)
	}
}

// finish heals every client's paths, releases what b got, and checks the history.
func finish(t *testing.T, e *env, held ...*held) {
	t.Helper()
	e.mu.Lock()
	for _, cl := range e.clients {
		cl.heal()
	}
	e.mu.Unlock()
	for _, hd := range held {
		if hd != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			hd.release(ctx)
			cancel()
		}
	}
	e.check()
}

// holderCutOff: the holder's paths picked by pick are blackholed past the
// TTL while another client waits for the name. If mustLose, the holder
// must be told by its local deadline; in any case no one else may hold
// the name before the holder is told.
func holderCutOff(t *testing.T, e *env, pick proxyPick, mustLose bool) {
	a, b := e.newClient(nil), e.newClient(nil)
	name := uniqueName("cutoff")
	ha := mustHold(t, a, name)
	ttl := ha.l.TTL()
	time.Sleep(ttl / 4) // a refresh or keepalive may be in flight: realistic
	ps := pick(e, a)
	if len(ps) == 0 {
		t.Fatalf("%s: no proxy to cut off", a.id)
	}
	t0 := time.Now()
	for _, p := range ps {
		p.Blackhole()
	}
	wb := waitFor(b, name, 3*ttl+5*time.Second)
	if mustLose {
		checkLostBound(t, ha, t0, fmt.Sprintf("blackholing %d path(s)", len(ps)))
	} else {
		// The holder keeps the lock through the surviving paths.
		if at, lost := ha.waitLost(2 * ttl); lost {
			t.Logf("%s: lost %v after the fault (allowed: it may fail over too late)", a.id, at.Sub(t0).Round(time.Millisecond))
		}
	}
	r := <-wb
	if mustLose && r.err != nil {
		t.Errorf("%s: never acquired the abandoned lock: %v", b.id, r.err)
	}
	if r.err == nil {
		t.Logf("%s: acquired %v after the fault", b.id, r.at.Sub(t0).Round(time.Millisecond))
	}
	finish(t, e, r.hd, ha)
}

// serverPaused: the servers targets picks are paused (SIGSTOP) for twice
// the TTL while the holder holds and another client waits.
func serverPaused(t *testing.T, e *env, targets func(*client) []*testenv.Server, mustLose bool) {
	a, b := e.newClient(nil), e.newClient(nil)
	name := uniqueName("pause")
	ha := mustHold(t, a, name)
	ttl := ha.l.TTL()
	time.Sleep(ttl / 4)
	ss := targets(a)
	if len(ss) == 0 {
		t.Fatal("no server to pause")
	}
	t0 := time.Now()
	for _, s := range ss {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if resumed {
			return
		}
		resumed = true
		for _, s := range ss {
			if err := s.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()
	wb := waitFor(b, name, 4*ttl+10*time.Second)
	if mustLose {
		checkLostBound(t, ha, t0, fmt.Sprintf("pausing %d server(s)", len(ss)))
	}
	// Keep them paused past the TTL in any case.
	time.Sleep(time.Until(t0.Add(2 * ttl)))
	resume()
	r := <-wb
	if mustLose && r.err != nil {
		t.Errorf("%s: never acquired after the servers came back: %v", b.id, r.err)
	}
	if r.err == nil {
		t.Logf("%s: acquired %v after the pause began", b.id, r.at.Sub(t0).Round(time.Millisecond))
	}
	finish(t, e, r.hd, ha)
}

// serverRestarted: the server is killed and started again while the
// holder holds. Without persistence the lock is gone at once; whoever
// takes it next must not overlap a holder that was not told.
func serverRestarted(t *testing.T, e *env) {
	a, b := e.newClient(nil), e.newClient(nil)
	name := uniqueName("restart")
	ha := mustHold(t, a, name)
	ttl := ha.l.TTL()
	time.Sleep(ttl / 4)
	t0 := time.Now()
	if err := e.servers[0].Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v", time.Since(t0).Round(time.Millisecond))
	// A lock that survives the restart may rightly stay with its holder,
	// whose refreshes reach the server again.
	wait := 4*ttl + 10*time.Second
	if e.spec.persistent {
		wait = 2 * ttl
	}
	r := <-waitFor(b, name, wait)
	switch {
	case r.err != nil && !e.spec.persistent:
		t.Errorf("%s: never acquired after the restart: %v", b.id, r.err)
	case r.err != nil:
		t.Logf("%s: not acquired within %v after the restart (the lock persisted); holder told at %v", b.id, wait, since(t0, ha.lostTime()))
	default:
		t.Logf("%s: acquired %v after the restart began; holder told at %v", b.id, r.at.Sub(t0).Round(time.Millisecond), since(t0, ha.lostTime()))
		// Hold it a while: a holder that was not told overlaps for that
		// long, beyond any allowance, and the history shows it.
		time.Sleep(ttl / 2)
	}
	finish(t, e, r.hd, ha)
}

func since(t0, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(t0).Round(time.Millisecond).String()
}

// latency: 50 ms each way on every path must cost no lock: the holder
// keeps it through three TTLs, and nobody else gets it.
func latency(t *testing.T, e *env) {
	a, b := e.newClient(nil), e.newClient(nil)
	a.delay(50*time.Millisecond, 50*time.Millisecond)
	b.delay(50*time.Millisecond, 50*time.Millisecond)
	name := uniqueName("latency")
	ha := mustHold(t, a, name)
	ttl := ha.l.TTL()
	end := time.Now().Add(3 * ttl)
	tries := 0
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), ttl)
		hb, err := b.acquire(ctx, name, "", false)
		cancel()
		tries++
		if err == nil {
			t.Errorf("%s: took a held lock under latency", b.id)
			hb.release(context.Background())
		}
		time.Sleep(ttl / 3)
	}
	if at := ha.lostTime(); !at.IsZero() {
		t.Errorf("%s: lost its lock under 50 ms of latency each way (after %v)", a.id, at.Sub(end.Add(-3*ttl)).Round(time.Millisecond))
	}
	t.Logf("%d refused tries over %v", tries, 3*ttl)
	finish(t, e, ha)
}

// waiterCancelled: a waiter cut off from the store returns promptly once
// its context is cancelled.
func waiterCancelled(t *testing.T, e *env) {
	a, b := e.newClient(nil), e.newClient(nil)
	name := uniqueName("cancel")
	ha := mustHold(t, a, name)
	// Warm b's connections, then cut it off.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := b.acquire(ctx, name, "", false); err == nil {
		t.Fatalf("%s: took a held lock", b.id)
	}
	cancel()
	b.blackhole()
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.acquire(ctx, name, "", true)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		took := time.Since(t0)
		t.Logf("%s: Acquire returned %v after cancel: %v", b.id, took.Round(time.Millisecond), err)
		if took > cancelBound {
			t.Errorf("%s: Acquire returned %v after cancel, bound %v", b.id, took.Round(time.Millisecond), cancelBound)
		}
		if err == nil {
			t.Errorf("%s: Acquire of a held lock succeeded", b.id)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("%s: Acquire still blocked 10 s after cancel", b.id)
	}
	finish(t, e, ha)
}

// closeCutOff: Close of a client cut off from the store returns within
// closeBound and leaves none of its goroutines behind.
func closeCutOff(t *testing.T, e *env) {
	a := e.newClient(nil)
	name := uniqueName("close")
	ha := mustHold(t, a, name)
	a.blackhole()
	done := make(chan struct{})
	go func() { a.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Close still blocked after 30 s", a.id)
	}
	t.Logf("%s: Close took %v cut off", a.id, a.closeTook.Round(time.Millisecond))
	if a.closeTook > closeBound {
		t.Errorf("%s: Close took %v cut off, bound %v", a.id, a.closeTook.Round(time.Millisecond), closeBound)
	}
	if left := testutil.LabeledAfter("faultclient", a.id, time.Second); len(left) > 0 {
		t.Errorf("%s: %d goroutine group(s) left after Close:\n%s", a.id, len(left), strings.Join(left, "\n\n"))
	}
	if _, lost := ha.waitLost(time.Second); !lost {
		t.Errorf("%s: Close did not signal the loss of its lock", a.id)
	}
	finish(t, e)
}
