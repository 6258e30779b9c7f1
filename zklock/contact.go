package zklock

import (
	"errors"
	"time"

	"github.com/go-zookeeper/zk"
)

// contact is the latest request on a session that the server answered:
// the session, when the request was handed to the zk client, and how long
// the answer took. Only answered requests count (see
// docs/backends/zklock.md, Keeping the contact fresh).
type contact struct {
	sid  int64
	sent time.Time
	rtt  time.Duration
}

// answered reports whether err is the server's answer to a request (a
// success, or a refusal such as "no node"), as opposed to the zk client's
// report of a lost connection or session.
func answered(err error) bool {
	return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) ||
		errors.Is(err, zk.ErrNotEmpty) || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoAuth)
}

// request runs f, one request on the connection, and counts it as contact
// when the server answered it on the session that was current before it
// was sent. Session ids only move forward (an expired session's id never
// comes back), so the same id before and after means the request went out
// and came back on that session.
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
		// Checked here, not only before: a touch of a session that has
		// just ended must not replace one of its successor.
		if d.conn.SessionID() != sid {
			return
		}
		if d.last.CompareAndSwap(cur, n) {
			if cur != nil && cur.sid != sid {
				notify(d.wake) // a new session: the monitor reports the old one's locks
			}
			return
		}
	}
}

// contactOf is Grant.Contact for a lock of session sid: when the driver
// sent the latest request on that session that the server answered; zero
// once the driver knows the session ended (expired, replaced, or closed
// with the driver).
func (d *Driver) contactOf(sid int64) time.Time {
	c := d.last.Load()
	if c == nil || c.sid != sid || d.gate.Closed() || d.conn.SessionID() != sid {
		return time.Time{}
	}
	return c.sent
}

// quickWait is how long a caller who gave up waits for the clean-up of its
// queue node: 100 ms plus one round trip, as last measured. When that is
// not enough (a dead connection), the clean-up goes on in the background.
func (d *Driver) quickWait() time.Duration {
	rtt := time.Duration(0)
	if c := d.last.Load(); c != nil {
		rtt = min(c.rtt, d.ttl/2)
	}
	return 100*time.Millisecond + rtt
}

// pinger keeps the contact fresh while the connection is quiet: an Exists
// on the root every pingPeriod, and resumeDelay after the zk client has a
// session again (see docs/backends/zklock.md, Keeping the contact fresh).
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
			// No session, or one just resumed: a request now would be the
			// first on the next connection (see resumeDelay).
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

// resumeDelay is how long after the zk client has a session again the
// driver waits before a request, so that its answer does not race the zk
// client's SetWatches (go-zookeeper/zk#35; see docs/backends/zklock.md,
// Requests after a reconnection).
const resumeDelay = 50 * time.Millisecond
