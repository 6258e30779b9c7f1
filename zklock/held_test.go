package zklock

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// Many locks held through a Client with automatic refresh cost no goroutine
// per lock: while their theft watches are being set, at most maxWatchers
// more than the driver's fixed set; once they are set, none. Every node of
// a burst is watched (a theft is reported), and Close, with locks held and
// watches still due, leaves no goroutine of the driver or of the zk client.
// Not parallel: it counts goroutines.
func TestHeldLocksGoroutines(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	other, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := waitSession(ctx, other); err != nil {
		t.Fatal(err)
	}
	// The session comes before the zk client starts its send and receive
	// loops: an answered request shows they run (a count taken at once
	// missed one, 1 run in about 10).
	if _, _, err := other.Exists("/"); err != nil {
		t.Fatal(err)
	}
	before := settledGoroutines(t, -1)
	d, err := dialDriver(ctx, servers)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := locker.New(d, locker.WithDefaultTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := uniqueKey(t)
	warm, err := c.TryAcquire(ctx, key+"/warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The driver's fixed set (its monitor and pinger, the zk client's
	// loops), once the warm-up's watch, if any, has gone.
	base := settledGoroutines(t, -1)
	// Each watch takes 10 ms more: with a goroutine per watch, a burst's
	// would pile up.
	d.testHookHeldWatch = func() { time.Sleep(10 * time.Millisecond) }
	stop, most := sampleWatchers()
	burst := func(tag string, n int) []*locker.Lock {
		locks := make([]*locker.Lock, n)
		var wg sync.WaitGroup
		var mu sync.Mutex
		next := 0
		for range 16 {
			wg.Go(func() {
				for {
					mu.Lock()
					i := next
					next++
					mu.Unlock()
					if i >= n {
						return
					}
					l, err := c.TryAcquire(ctx, fmt.Sprintf("%s/%s-%d", key, tag, i))
					if err != nil {
						t.Error(err)
						return
					}
					locks[i] = l
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		return locks
	}
	const n = 1000
	locks := burst("a", n)
	// Once the watches are set, the driver's fixed set alone.
	if g := settledGoroutines(t, base); g != base {
		t.Errorf("%d goroutines of the driver or the zk client while %d locks are held, %d before", g, n, base)
	}
	stop()
	if m := most(); m > maxWatchers {
		t.Errorf("%d goroutines setting theft watches at once, want at most %d", m, maxWatchers)
	} else if m == 0 {
		t.Error("no goroutine seen setting a theft watch")
	}
	// Each node of the burst is watched: a theft of the first, a middle
	// and the last is reported.
	for _, i := range []int{0, n / 2, n - 1} {
		d.mu.Lock()
		h := d.holds[string(locks[i].Token())]
		d.mu.Unlock()
		if h == nil {
			t.Fatalf("lock %d: not among the driver's holds", i)
		}
		if err := other.Delete(h.path, -1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-locks[i].Lost():
		case <-time.After(5 * time.Second):
			t.Fatalf("lock %d: no lost signal within 5s of its node's deletion", i)
		}
	}
	for _, l := range locks[:n/2] {
		l.Release(ctx)
	}
	// Close with locks held and a burst whose watches are still due.
	burst("b", 200)
	if err := c.Close(); err != nil { // closes d
		t.Fatal(err)
	}
	if g := settledGoroutines(t, before); g > before {
		_, stacks := zkGoroutines()
		t.Errorf("%d goroutines of the driver or the zk client after Close, %d before:\n%s", g, before, stacks)
	}
}

// sampleWatchers counts, every 2 ms until stop, the goroutines setting a
// theft watch; most is the greatest count seen.
func sampleWatchers() (stop func(), most func() int) {
	done, ended := make(chan struct{}), make(chan struct{})
	m := 0
	go func() {
		defer close(ended)
		buf := make([]byte, 1<<20)
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			n := 0
			for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
				if strings.Contains(g, "zklock.(*Driver).watch") && strings.Contains(g, "(*Driver).watchNow") {
					n++
				}
			}
			m = max(m, n)
		}
	}()
	return func() { close(done); <-ended }, func() int { return m }
}

// settledGoroutines waits, up to 10 s, until zkGoroutines is down to want
// (or, with want < 0, has not changed for 100 ms), and returns it.
func settledGoroutines(t *testing.T, want int) int {
	t.Helper()
	n, _ := zkGoroutines()
	same := 0
	for range 1000 {
		time.Sleep(10 * time.Millisecond)
		m, _ := zkGoroutines()
		if want >= 0 && m <= want {
			return m
		}
		if m == n {
			if same++; want < 0 && same >= 10 {
				return m
			}
		} else {
			n, same = m, 0
		}
	}
	return n
}
