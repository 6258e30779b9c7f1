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
	tick int                 // ticks so far
	live map[*cutAttempt]int // attempts in flight → the tick they were filed at
	wake chan struct{}       // an attempt was filed when none was
}

type cutAttempt struct{ cancel context.CancelFunc }

func newCutter() *cutter {
	return &cutter{live: map[*cutAttempt]int{}, wake: make(chan struct{}, 1)}
}

// start returns ctx for one attempt, cut once it has run for
// attemptTimeout, and end, which the attempt calls when it returns.
func (c *cutter) start(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	a := &cutAttempt{cancel}
	c.mu.Lock()
	c.live[a] = c.tick
	if len(c.live) == 1 {
		select {
		case c.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(c.live, a)
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
			var late []*cutAttempt
			c.mu.Lock()
			c.tick++
			for a, filed := range c.live {
				// Filed attemptTimeout to attemptTimeout+cutTick ago.
				if c.tick-filed > int(attemptTimeout/cutTick) {
					delete(c.live, a)
					late = append(late, a)
				}
			}
			busy = len(c.live) > 0
			c.mu.Unlock()
			for _, a := range late {
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
