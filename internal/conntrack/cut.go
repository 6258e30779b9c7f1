package conntrack

import (
	"context"
	"sync"
	"time"
)

// Grace is how long a read blocked when a call's context ended may go on
// before CutOnEnd cuts it: a healthy server answers within a few
// milliseconds, so it is almost surely a dead connection, and a cancelled
// call stays within the backend contract's 100 ms plus a round trip.
const Grace = 50 * time.Millisecond

// maxRounds bounds a Watch's cuts: a call still running after this many
// rounds (a second) is left to its client's own timeouts.
const maxRounds = 20

// A Watch is one call's: see CutOnEnd.
type Watch struct {
	t      *Tracker
	stopAF func() bool
	fire   func() // w.watch, made once: a Watch is reused (watches)
	mu     sync.Mutex
	done   bool          // Stop was called
	ended  chan struct{} // made by fire, closed by Stop
}

// CutOnEnd has the end of ctx cut the reads that block a call made with
// it, for clients that never watch a context while they read (go-redis,
// the zk client), until Stop: the reads in progress when ctx ends are
// noted, and those still blocked Grace later cut, in rounds while the call
// runs (it may be between requests, or on a new connection). A nil Tracker
// (a client the driver did not dial) or a ctx that never ends needs no
// Watch: nil, whose Stop does nothing.
func (t *Tracker) CutOnEnd(ctx context.Context) *Watch {
	if t == nil || ctx.Done() == nil {
		return nil
	}
	w := watches.Get().(*Watch)
	w.t = t
	w.stopAF = context.AfterFunc(ctx, w.fire)
	return w
}

// watches keeps the Watches whose fire never ran, for reuse: two
// allocations less a call.
var watches = sync.Pool{New: func() any {
	w := &Watch{}
	w.fire = w.watch
	return w
}}

// Stop ends the watch: the call returned.
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	if w.stopAF() { // fire never runs: nothing to tell it
		w.t, w.stopAF = nil, nil
		watches.Put(w)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.done = true
		if w.ended != nil {
			close(w.ended)
		}
	}
}

func (w *Watch) watch() {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	w.ended = make(chan struct{}) // only a call whose context ended needs it
	w.mu.Unlock()
	t := time.NewTimer(Grace)
	defer t.Stop()
	for range maxRounds {
		blocked := w.t.Reading()
		t.Reset(Grace)
		select {
		case <-w.ended:
			return
		case <-t.C:
		}
		// Under mu, as Stop sets done: no cut once the call has returned
		// (the read may be another call's by then).
		w.mu.Lock()
		for _, r := range blocked {
			if !w.done && r.Interrupt() {
				w.t.cuts.Add(1)
			}
		}
		w.mu.Unlock()
	}
}

// Cuts is how many reads CutOnEnd's watches have cut.
func (t *Tracker) Cuts() int64 { return t.cuts.Load() }
