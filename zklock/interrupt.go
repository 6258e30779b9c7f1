package zklock

import (
	"context"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// Calls on the caller's goroutine, cut when their context ends: see
// docs/backends/zklock.md (Calls and cancellation) for how and why.

// interruptGrace is how long a read blocked when a call's context ended may
// go on before it is cut: a healthy ensemble answers within a few
// milliseconds, so it is almost surely a dead connection, and a cancelled
// call stays within the contract's 100 ms plus a round trip.
const interruptGrace = 50 * time.Millisecond

// maxRounds bounds an interruption: a call still running after this many
// rounds of cuts (a second) is left to the zk client's own timeouts.
const maxRounds = 20

// inline reports whether a call may run on the caller's goroutine: the
// driver dialed the connection (it can cut its reads) and has a session (a
// request is sent at once, not queued for the next connection).
func (d *Driver) inline() bool {
	return d.dialed != nil && !d.testNoInline && d.conn.State() == zk.StateHasSession
}

// interruption is one inline call's: while the call runs after its
// context ended, reads blocked for interruptGrace are cut.
type interruption struct {
	d      *Driver
	stopAF func() bool
	mu     sync.Mutex
	done   bool          // stop was called
	ended  chan struct{} // made by fire, closed by stop
}

// interruptOnEnd makes the end of ctx interrupt the reads that block an
// inline call made with it, until stop.
func (d *Driver) interruptOnEnd(ctx context.Context) *interruption {
	if ctx.Done() == nil {
		return nil
	}
	in := &interruption{d: d}
	in.stopAF = context.AfterFunc(ctx, in.fire)
	return in
}

// stop ends the interruption: the call returned.
func (in *interruption) stop() {
	if in == nil || in.stopAF() {
		return // fire never runs: nothing to tell it
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.done {
		in.done = true
		if in.ended != nil {
			close(in.ended)
		}
	}
}

// fire runs when the call's context ends: it notes the reads in progress
// and cuts those still blocked interruptGrace later, in rounds while the
// call runs (it may be between requests, or on a new connection); it
// returns as soon as the call does.
func (in *interruption) fire() {
	in.mu.Lock()
	if in.done {
		in.mu.Unlock()
		return
	}
	in.ended = make(chan struct{}) // only a call whose context ended needs it
	in.mu.Unlock()
	t := time.NewTimer(interruptGrace)
	defer t.Stop()
	for range maxRounds {
		blocked := in.d.dialed.conns.Reading()
		t.Reset(interruptGrace)
		select {
		case <-in.ended:
			return
		case <-t.C:
		}
		// Under mu, as stop sets done: no cut once the call has returned
		// (the read may be another call's by then).
		in.mu.Lock()
		for _, r := range blocked {
			if !in.done && r.Interrupt() {
				in.d.cuts.Add(1)
			}
		}
		in.mu.Unlock()
	}
}
