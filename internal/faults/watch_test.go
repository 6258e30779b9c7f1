package faults

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/faultproxy"
)

// watchSpecs are the deployments whose driver is a backend.Notifier.
var watchSpecs = map[string]bool{"redis": true, "postgres": true, "etcd": true, "zk": true}

// Bounds of the Watch cases: generous, for a busy 2-core machine under
// -race and the reconnect backoffs of the client libraries.
const (
	watchFaultFor    = 3 * time.Second  // how long A stays cut off
	watchAfterHeal   = 20 * time.Second // for A's value after the restore
	watchLaterBound  = 10 * time.Second // for a release once A is back
	watchQuietPeriod = 500 * time.Millisecond
)

// watchFault is one way to cut a client off, and to restore it.
type watchFault struct {
	name  string
	apply func(cl *client)
}

var watchFaults = []watchFault{
	// Cut resets the connections; refusing new ones keeps A cut off
	// until the restore instead of letting it reconnect at once.
	{"cut", func(cl *client) {
		cl.each(func(p *faultproxy.Proxy) { p.Refuse(true) })
		cl.cut()
	}},
	// Bytes both ways dropped, connections left open.
	{"blackhole", func(cl *client) { cl.blackhole() }},
}

// TestWatchThroughFaults: a change made while a watcher is cut off from
// the store is not missed. Client A watches a name through its proxy;
// while A is cut off (or blackholed), client B, on a direct connection,
// acquires and releases the name; after the restore A's channel must
// receive a value within watchAfterHeal (so that the watcher reads the
// state again), and a later release must be reported too.
func TestWatchThroughFaults(t *testing.T) {
	for _, sp := range specs() {
		if !watchSpecs[sp.name] {
			continue
		}
		t.Run(sp.name, func(t *testing.T) {
			t.Parallel()
			servers := sp.start(t)
			for _, f := range watchFaults {
				t.Run(f.name, func(t *testing.T) { watchThroughFault(t, newEnv(t, sp, servers), f) })
			}
		})
	}
}

// watchLog timestamps every value a Watch channel delivers.
type watchLog struct {
	mu  sync.Mutex
	at  []time.Time
	got chan struct{} // a value arrived (buffered 1)
}

func startWatchLog(ch <-chan struct{}, stop <-chan struct{}) *watchLog {
	w := &watchLog{got: make(chan struct{}, 1)}
	go func() {
		for {
			select {
			case <-ch:
				w.mu.Lock()
				w.at = append(w.at, time.Now())
				w.mu.Unlock()
				select {
				case w.got <- struct{}{}:
				default:
				}
			case <-stop:
				return
			}
		}
	}()
	return w
}

// firstAfter waits up to d for a value received at or after t0 and
// returns when it came.
func (w *watchLog) firstAfter(t0 time.Time, d time.Duration) (time.Time, bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, at := range w.at {
			if !at.Before(t0) {
				w.mu.Unlock()
				return at, true
			}
		}
		w.mu.Unlock()
		select {
		case <-w.got:
		case <-deadline.C:
			return time.Time{}, false
		}
	}
}

// count is how many values arrived in [from, to).
func (w *watchLog) count(from, to time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, at := range w.at {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// quiet waits, at most max, until no value has arrived for
// watchQuietPeriod, counted from the call at the earliest (a value may
// be on its way).
func (w *watchLog) quiet(max time.Duration) {
	start := time.Now()
	for end := start.Add(max); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		w.mu.Lock()
		last := start
		if n := len(w.at); n > 0 && w.at[n-1].After(last) {
			last = w.at[n-1]
		}
		w.mu.Unlock()
		if time.Since(last) >= watchQuietPeriod {
			return
		}
	}
}

// directClient opens a client straight to the servers, past every proxy.
func directClient(t *testing.T, e *env) *locker.Client {
	t.Helper()
	var addrs []string
	for _, s := range e.servers {
		addrs = append(addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, e.spec.url(e.servers, addrs), locker.WithDefaultTTL(e.spec.ttl))
	if err != nil {
		t.Fatalf("direct client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// takeAndRelease acquires name with c and releases it, within 10 s each.
func takeAndRelease(t *testing.T, c *locker.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("direct client: acquire %s: %v", name, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("direct client: release %s: %v", name, err)
	}
}

func watchThroughFault(t *testing.T, e *env, f watchFault) {
	a := e.newClient(nil)
	b := directClient(t, e)
	name := uniqueName("watch-" + f.name)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, stop, err := a.c.Watch(ctx, name)
	if err != nil {
		t.Fatalf("%s: watch: %v", a.id, err)
	}
	defer stop()
	done := make(chan struct{})
	defer close(done)
	w := startWatchLog(ch, done)

	// The watch works before the fault (past any value a new
	// subscription sends).
	w.quiet(5 * time.Second)
	t0 := time.Now()
	takeAndRelease(t, b, name)
	at, ok := w.firstAfter(t0, watchLaterBound)
	if !ok {
		t.Fatalf("%s: no value within %v of a release before any fault", a.id, watchLaterBound)
	}
	t.Logf("%s: release before the fault reported %v after it began", a.id, at.Sub(t0).Round(time.Millisecond))
	w.quiet(5 * time.Second)

	faultAt := time.Now()
	f.apply(a)
	healed := false
	heal := func() {
		if !healed {
			healed = true
			a.heal()
		}
	}
	defer heal()
	// Let the fault take hold (a cut connection is seen broken, a
	// reconnection refused) before the change.
	time.Sleep(time.Second)
	changeAt := time.Now()
	takeAndRelease(t, b, name)
	changed := time.Now()
	time.Sleep(time.Until(faultAt.Add(watchFaultFor)))
	restoreAt := time.Now()
	heal()
	t.Logf("%s: %d value(s) while cut off before the change, %d during or after it",
		a.id, w.count(faultAt, changeAt), w.count(changeAt, restoreAt))

	at, ok = w.firstAfter(restoreAt, watchAfterHeal)
	if !ok {
		t.Fatalf("%s: no value within %v of the restore: the release made %v into the %s (took %v) was missed",
			a.id, watchAfterHeal, changeAt.Sub(faultAt).Round(time.Millisecond), f.name, changed.Sub(changeAt).Round(time.Millisecond))
	}
	t.Logf("%s: value %v after the restore", a.id, at.Sub(restoreAt).Round(time.Millisecond))

	// Back to normal: a later release is reported too.
	w.quiet(5 * time.Second)
	t1 := time.Now()
	takeAndRelease(t, b, name)
	at, ok = w.firstAfter(t1, watchLaterBound)
	if !ok {
		t.Fatalf("%s: no value within %v of a release after the restore", a.id, watchLaterBound)
	}
	t.Logf("%s: later release reported %v after it began", a.id, at.Sub(t1).Round(time.Millisecond))
}
