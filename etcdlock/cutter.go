package etcdlock

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// cutTick is how often the cutter looks; an attempt is cut between
// attemptTimeout and attemptTimeout+cutTick after it began.
const cutTick = attemptTimeout / 8

// cutter bounds each attempt of a request by attemptTimeout with one ticker
// for the driver, running only while attempts are in flight: a deadline
// per attempt costs timers on both sides (see "Store failures" in the
// docs). Each tick cancels the attempts filed attemptTimeout/cutTick+1
// ticks back.
type cutter struct {
	mu   sync.Mutex
	ring [attemptTimeout/cutTick + 1]map[*cutAttempt]struct{}
	cur  int
	n    int           // attempts filed
	wake chan struct{} // an attempt was filed when none was
}

type cutAttempt struct {
	cancel context.CancelFunc
	slot   int // where in ring it is filed, unless cut since
}

func newCutter() *cutter {
	c := &cutter{wake: make(chan struct{}, 1)}
	for i := range c.ring {
		c.ring[i] = map[*cutAttempt]struct{}{}
	}
	return c
}

// start returns ctx for one attempt, cut once it has run for
// attemptTimeout, and end, which the attempt calls when it returns.
func (c *cutter) start(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	a := &cutAttempt{cancel: cancel}
	c.mu.Lock()
	a.slot = c.cur
	c.ring[a.slot][a] = struct{}{}
	c.n++
	if c.n == 1 {
		select {
		case c.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		// A slot cut since has a new map, without a.
		if _, ok := c.ring[a.slot][a]; ok {
			delete(c.ring[a.slot], a)
			c.n--
		}
		c.mu.Unlock()
		cancel()
	}
}

// run ticks while attempts are filed, until ctx ends.
func (c *cutter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		t := time.NewTicker(cutTick)
		for busy := true; busy; {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			c.mu.Lock()
			c.cur = (c.cur + 1) % len(c.ring)
			// Filed attemptTimeout to attemptTimeout+cutTick ago; the map
			// stays in the ring, for new attempts, only if empty.
			old := c.ring[c.cur]
			if len(old) > 0 {
				c.ring[c.cur] = map[*cutAttempt]struct{}{}
				c.n -= len(old)
			} else {
				old = nil
			}
			busy = c.n > 0
			c.mu.Unlock()
			for a := range old {
				a.cancel()
			}
		}
		t.Stop()
	}
}

// attempt returns the context of one attempt, cut by the cutter, and
// requiring a leader, so that a member without one refuses at once (a
// write it would drop, a read it would hold), and its end.
func (d *Driver) attempt(ctx context.Context) (context.Context, func()) {
	return d.cut.start(clientv3.WithRequireLeader(ctx))
}
