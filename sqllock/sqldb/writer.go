package sqldb

import (
	"context"
	"slices"
	"sync"
)

// writeGate lets one write statement or transaction in at a time, for a
// database that lets one writer in (Dialect.oneWriter): the others wait
// here, in arrival order within their class, rather than in its busy
// handler, whose growing sleeps make the tail long. Grants wait behind
// every other write: the refreshes that keep holds alive, the releases
// and undos that end them. In arrival order alone, a holder's refresh
// queued behind the grant attempts of the waiters its release had woken,
// each a transaction of 10-30 ms on a loaded machine, and missed the
// TTL (16 to 20 of them, 0.3 s and more, against 2/3 of a 500 ms TTL). Refreshes come
// at most three per hold and TTL, so grants are not starved.
type writeGate struct {
	mu    sync.Mutex
	held  bool
	queue [2][]chan struct{} // waiters: [0] the urgent ones, [1] grants
}

// lock waits for the gate, behind the other waiters of its class and,
// for a grant, behind every urgent one; it returns ctx's cause if ctx
// ends first.
func (g *writeGate) lock(ctx context.Context, grant bool) error {
	class := 0
	if grant {
		class = 1
	}
	g.mu.Lock()
	if !g.held {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.queue[class] = append(g.queue[class], ch)
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.queue[class], ch); i >= 0 {
		g.queue[class] = slices.Delete(g.queue[class], i, i+1)
	} else {
		g.handOff() // handed the gate as ctx ended: pass it on
	}
	return context.Cause(ctx)
}

// unlock hands the gate to the first urgent waiter, else the first grant.
func (g *writeGate) unlock() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.handOff()
}

func (g *writeGate) handOff() {
	for i, q := range g.queue {
		if len(q) > 0 {
			close(q[0])
			g.queue[i] = q[1:]
			return
		}
	}
	g.held = false
}

// writers are the process-wide write gates of Dialect.writerKey, one per
// database ever opened (so, bounded).
var writers struct {
	sync.Mutex
	m map[string]*writeGate
}

func sharedWriter(key string) *writeGate {
	writers.Lock()
	defer writers.Unlock()
	if writers.m == nil {
		writers.m = make(map[string]*writeGate)
	}
	if writers.m[key] == nil {
		writers.m[key] = new(writeGate)
	}
	return writers.m[key]
}

// lockWriter takes the write gate, where the dialect has one, and returns
// its unlock.
func (d *Driver) lockWriter(ctx context.Context, grant bool) (func(), error) {
	if !d.dialect.oneWriter {
		return func() {}, nil
	}
	w := d.writer
	if err := w.lock(ctx, grant); err != nil {
		return nil, err
	}
	return w.unlock, nil
}
