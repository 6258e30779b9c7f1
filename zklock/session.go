package zklock

import (
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// monitor reports lost locks: when the session that owns their nodes has
// expired (the zk client then opens a new one), or when the server has
// been silent for so long that it may have expired the session. A
// disconnect alone loses nothing: the nodes live while the session can be
// resumed, and the zk client resumes it on any server of the ensemble.
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
func (d *Driver) check(now time.Time, poll time.Duration) time.Duration {
	state, sid := d.conn.State(), d.conn.SessionID()
	// The server expires a session ttl after it last heard from us, which
	// was before it last answered: keep a tenth of the ttl as margin.
	var deadline time.Time
	if d.wire != nil {
		deadline = d.wire.lastContact().Add(d.ttl - d.ttl/10)
	} else {
		// Polling a caller's connection: a drop is noticed up to 2/3 of
		// the ttl after the server's last word (the zk client's read
		// timeout), and we see it up to a poll later.
		if state == zk.StateHasSession {
			d.lastGood = now
		}
		deadline = d.lastGood.Add(d.ttl/3 - poll)
	}
	silent := !now.Before(deadline)

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
			err = fmt.Errorf("zklock: %w: no word from ZooKeeper for about the session timeout (%v): the session may have expired", backend.ErrLost, d.ttl)
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
