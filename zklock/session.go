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

// monitor reports lost locks: when the session that owns their nodes has
// ended (the zk client then opens a new one), or when the last request
// the server answered on it was sent so long ago that the server may have
// expired it. A disconnect alone loses nothing: the nodes live while the
// session can be resumed, and the zk client resumes it on any server of
// the ensemble.
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
// returns when to look again.
//
// The server expires a session one timeout after it last heard from the
// client, which is no earlier than when the driver sent the latest request
// it answered (the contact); ClockMargin covers the server's clock running
// faster than ours and timer slack.
func (d *Driver) check(now time.Time, poll time.Duration) time.Duration {
	sid := d.conn.SessionID()
	at := d.contactOf(sid)
	deadline := at.Add(d.ttl - backend.ClockMargin(d.ttl))
	silent := at.IsZero() || !now.Before(deadline)

	type loss struct {
		f   func(error)
		err error
	}
	var losses []loss
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
		if h.onLost != nil {
			losses = append(losses, loss{h.onLost, err})
		}
	}
	d.mu.Unlock()
	for _, l := range losses {
		l.f(l.err)
	}
	for _, h := range orphans {
		d.spawn(func() { d.dropLost(h.path, "", h.session) }) // lost: its marker keeps the delay
	}
	next := poll
	if until := deadline.Sub(now); until > 0 && until < next {
		next = until
	}
	return next
}

// dropLost deletes the node of a lock declared lost while its session may
// still live (the holder was told, so the waiters behind it must not wait
// for the session), or of a queue node whose delete failed. It retries,
// each try after the session settled (see resumeDelay), until the node is
// gone, the session is (its nodes go with it) or the driver closes.
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
		if !pause(d.gate.Context(), bo) {
			return
		}
	}
}

// untilResumed is how long to wait before a request that may be the first
// on a new connection: while the zk client has no session, the next
// retry; then until resumeDelay after it has one again.
// On a connection the caller passed, the driver sees no session events:
// only the first condition holds.
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
// first on a new connection (see resumeDelay). With no session it waits
// for one, for at most a session timeout and the zk client's pause
// between rounds of its servers; false if none came.
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

// errNoSession is the store's error of a try not sent for want of a
// session.
var errNoSession = fmt.Errorf("%w (no session)", zk.ErrNoServer)
