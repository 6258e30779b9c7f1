package zklock

import (
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
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
		next := d.check(time.Now(), poll)
		t.Reset(next)
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
	next := poll
	if until := deadline.Sub(now); until > 0 && until < next {
		next = until
	}
	return next
}
