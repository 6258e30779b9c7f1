package zklock

import (
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// contact is the latest request the server answered: its session, when it
// was sent and how long the answer took (see docs/backends/zklock.md,
// Keeping the contact fresh).
type contact struct {
	sid  int64
	sent time.Time
	rtt  time.Duration
}

// answered reports whether err is the server's answer (a success or a
// refusal), not a lost connection or session.
func answered(err error) bool {
	return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) ||
		errors.Is(err, zk.ErrNotEmpty) || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoAuth)
}

// request runs f, one request, and counts it as contact when the server
// answered it on the session current before it was sent (ids only move
// forward: the same id before and after means that session all along).
func request[T any](d *Driver, f func() (T, error)) (T, error) {
	sid, sent := d.conn.SessionID(), time.Now()
	v, err := f()
	if sid != 0 && answered(err) {
		d.touch(sid, sent, time.Since(sent))
	}
	return v, err
}

// touch records an answered request sent at sent on session sid.
func (d *Driver) touch(sid int64, sent time.Time, rtt time.Duration) {
	n := &contact{sid: sid, sent: sent, rtt: rtt}
	for {
		cur := d.last.Load()
		if cur != nil && cur.sid == sid && !sent.After(cur.sent) {
			return
		}
		// Checked here too: a touch of a session just ended must not
		// replace one of its successor.
		if d.conn.SessionID() != sid {
			return
		}
		if d.last.CompareAndSwap(cur, n) {
			if cur != nil && cur.sid != sid {
				backend.Notify(d.wake) // a new session: the monitor reports the old one's locks
			}
			return
		}
	}
}

// contactOf is Grant.Contact for a lock of session sid: the contact's
// sending time, zero once the session is known ended.
func (d *Driver) contactOf(sid int64) time.Time {
	c := d.last.Load()
	if c == nil || c.sid != sid || d.gate.Closed() || d.conn.SessionID() != sid {
		return time.Time{}
	}
	return c.sent
}

// quickWait is how long a caller who gave up waits for the delete of its
// queue node (100 ms and the last round trip); then it goes on in the
// background.
func (d *Driver) quickWait() time.Duration {
	rtt := time.Duration(0)
	if c := d.last.Load(); c != nil {
		rtt = min(c.rtt, d.ttl/2)
	}
	return 100*time.Millisecond + rtt
}

// pinger keeps the contact fresh: an Exists on the root every pingPeriod,
// and resumeDelay after the zk client has a session again.
func (d *Driver) pinger() {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-t.C:
		case <-d.resumed:
			t.Reset(resumeDelay)
			continue
		}
		if w := d.untilResumed(); w != 0 {
			// No session, or one just resumed (see resumeDelay).
			t.Reset(max(w, resumeDelay))
			continue
		}
		_, _ = request(d, func() (bool, error) {
			ok, _, err := d.conn.Exists(d.root)
			return ok, err
		})
		t.Reset(d.pingPeriod())
	}
}

func (d *Driver) pingPeriod() time.Duration { return d.ttl / 4 }

// resumeDelay is the pause before a request after the zk client has a
// session again, so that its answer does not race the zk client's
// SetWatches (go-zookeeper/zk#35; docs/backends/zklock.md, Requests after
// a reconnection).
const resumeDelay = 50 * time.Millisecond
