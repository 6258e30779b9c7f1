package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// monitor reports lost locks: when their session has ended, or when the
// last request the server answered on it was sent so long ago that the
// server may have expired it. A disconnect alone loses nothing: the zk
// client may resume the session on any server.
func (d *Driver) monitor() {
	poll := min(max(d.ttl/10, 10*time.Millisecond), time.Second)
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-d.wake:
		case <-t.C:
		}
		t.Reset(d.check(time.Now(), poll))
	}
}

// check fires OnLost for every lock whose session is gone or may be, and
// returns when to look again. The server expires a session a timeout after
// it last heard from us, no earlier than the contact; ClockMargin covers
// its clock running faster than ours, and timer slack.
func (d *Driver) check(now time.Time, poll time.Duration) time.Duration {
	sid := d.conn.SessionID()
	at := d.contactOf(sid)
	deadline := at.Add(d.ttl - backend.ClockMargin(d.ttl))
	silent := at.IsZero() || !now.Before(deadline)

	var losses []func()
	var orphans []*held // told lost, but their session may live on
	d.mu.Lock()
	for _, h := range d.holds {
		if h.lost {
			continue
		}
		var err error
		switch {
		case h.session != sid:
			err = fmt.Errorf("zklock: %w: session %#x expired", backend.ErrLost, h.session)
		case silent:
			err = fmt.Errorf("zklock: %w: no answer from ZooKeeper to a request sent in the last session timeout (%v): the session may have expired", backend.ErrLost, d.ttl)
			orphans = append(orphans, h)
		default:
			continue
		}
		h.lost = true
		if f := h.onLost; f != nil {
			losses = append(losses, func() { f(err) })
		}
	}
	d.mu.Unlock()
	for _, f := range losses {
		f()
	}
	for _, h := range orphans {
		d.spawn(func() { d.dropLost(h.path, "", h.session) }) // lost: its marker keeps the delay
	}
	if until := deadline.Sub(now); until > 0 {
		return min(until, poll)
	}
	return poll
}

// dropLost deletes the node of a lock declared lost while its session may
// live (its waiters must not wait for the session), or of a queue node
// whose delete failed: retried, once the session settled, until the node
// or the session is gone or the driver closes.
func (d *Driver) dropLost(path, marker string, session int64) {
	bo := newBackoff()
	for !d.gate.Closed() && d.conn.SessionID() == session {
		if !d.settled(d.gate.Context()) {
			continue // closed, or still no session: see the loop's test
		}
		_, err := request(d, func() (struct{}, error) { return struct{}{}, d.deleteWith(path, marker, -1) })
		switch {
		case err == nil:
			d.log.Debug("zklock: deleted a node nobody holds", "path", path)
			return
		case errors.Is(err, zk.ErrNoNode), d.gate.Closed():
			return
		case !transient(err):
			d.log.Warn("zklock: could not delete the node of a lost lock; it goes with the session", "path", path, "err", err)
			return
		}
		if !bo.Pause(d.gate.Context()) {
			return
		}
	}
}

// untilResumed is how long to wait before a request that may be the first
// on a new connection: -1 while there is no session, then until
// resumeDelay after there is (0 on the caller's, whose events we miss).
func (d *Driver) untilResumed() time.Duration {
	if !d.own {
		if d.conn.State() != zk.StateHasSession {
			return -1
		}
		return 0
	}
	at := d.since.Load()
	if at == 0 {
		return -1 // no session: the backoff's next step
	}
	return max(resumeDelay-time.Since(time.Unix(0, at)), 0)
}

// settled waits, within ctx, until a request sent now would not be the
// first on a new connection (see resumeDelay): with no session, for a
// session timeout and a round of the servers at most; false if none came.
func (d *Driver) settled(ctx context.Context) bool {
	deadline := time.Now().Add(d.ttl + time.Second)
	for {
		w := d.untilResumed()
		if w == 0 {
			return true
		}
		if w < 0 {
			w = noSessionPoll
		}
		if time.Until(deadline) < w || retry.Sleep(ctx, w) != nil {
			return false
		}
	}
}

// noSessionPoll is how often settled looks for a new session.
const noSessionPoll = 20 * time.Millisecond

// errNoSession: a try not sent for want of a session.
var errNoSession = fmt.Errorf("%w (no session)", zk.ErrNoServer)
