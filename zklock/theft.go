package zklock

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// Theft watches: a deletion or change of a held node that the driver did
// not make is a loss (see docs/backends/zklock.md, Theft watches).

// watchDelay is how long a lock is held before its node is watched: a
// short hold costs no read queued ahead of its release. A change before
// is seen by the watch's read or by the release (the node gone).
const watchDelay = 10 * time.Millisecond

// maxWatchers bounds the goroutines that set theft watches at once. The
// holds wait in grant order (so due order) behind one timer: no timer or
// goroutine per lock, none while no watch is due.
const maxWatchers = 4

// watchQueue is the holds whose node is not watched yet (under d.mu).
type watchQueue struct {
	holds    []*held     // FIFO by due time
	timer    *time.Timer // fires when the first is due (watchFire)
	armed    bool        // timer set, its callback not yet run
	watchers int         // goroutines watching
}

// watchHeld queues h, just granted, to be watched after watchDelay. d.mu
// is held.
func (d *Driver) watchHeld(h *held) {
	q := &d.watches
	h.due = time.Now().Add(watchDelay)
	h.queued = true
	q.holds = append(q.holds, h)
	if q.armed || q.watchers > 0 {
		return // the timer or a watcher reaches it
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(watchDelay, d.watchFire)
	} else {
		q.timer.Reset(watchDelay)
	}
}

// unwatch takes h, released or lost, out of the watch queue, stopping the
// timer when it is empty. d.mu is held.
func (d *Driver) unwatch(h *held) {
	q := &d.watches
	h.done = true
	if !h.queued {
		return
	}
	// A lock released soon after it was granted is usually the last.
	if n := len(q.holds); n > 0 && q.holds[n-1] == h {
		q.holds[n-1] = nil
		q.holds = q.holds[:n-1]
		h.queued = false
	}
	if len(q.holds) == 0 && q.armed && q.timer.Stop() {
		q.armed = false
	}
}

// watchFire is the timer's callback: it becomes a watcher.
func (d *Driver) watchFire() {
	d.mu.Lock()
	d.watches.armed = false
	if d.stopped || d.watches.watchers >= maxWatchers {
		// Those watching go on to the queue's next hold.
		d.mu.Unlock()
		return
	}
	d.watches.watchers++
	d.wg.Add(1)
	d.mu.Unlock()
	defer d.wg.Done()
	d.watchLoop()
}

// watchLoop, a watcher (counted in watchers), watches the due holds one at
// a time, starting another watcher while more are due, until none is due
// (then the timer is set for the next).
func (d *Driver) watchLoop() {
	q := &d.watches
	d.mu.Lock()
	for {
		var h *held
		for len(q.holds) > 0 && h == nil {
			first := q.holds[0]
			if wait := time.Until(first.due); wait > 0 && !first.done {
				if !q.armed && !d.stopped {
					q.armed = true
					q.timer.Reset(wait)
				}
				break
			}
			first.queued = false
			q.holds[0] = nil
			q.holds = q.holds[1:]
			if !first.done {
				h = first
			}
		}
		if h == nil || d.stopped {
			q.watchers--
			if len(q.holds) == 0 {
				q.holds = nil // let a burst's backing array go
			}
			d.mu.Unlock()
			return
		}
		if len(q.holds) > 0 && !q.holds[0].due.After(time.Now()) && q.watchers < maxWatchers {
			q.watchers++
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.watchLoop()
			}()
		}
		lost, path, session := h.lost, h.path, h.session
		d.mu.Unlock()
		if !lost && d.conn.SessionID() == session {
			d.watchNow(path, session) // else reported already, or by the session's monitor
		}
		d.mu.Lock()
	}
}

// watchNow sets the watch of a held node: nodeEvent sees it fire on our
// own connection, a goroutine on the caller's.
func (d *Driver) watchNow(path string, session int64) {
	if d.testHookHeldWatch != nil {
		d.testHookHeldWatch()
	}
	// GetW, not ExistsW: see watch.
	switch _, st, ch, err := d.conn.GetW(path); {
	case errors.Is(err, zk.ErrNoNode):
		d.stolen(path, session, "was deleted")
	case err != nil:
		// The session's monitor reports what becomes of the lock.
	case st.Version != 0 || st.EphemeralOwner != session:
		// Changed between the grant and the watch.
		d.stolen(path, session, "was overwritten")
	case !d.own: // on our own connection, nodeEvent sees the notification
		d.spawn(func() {
			select {
			case ev := <-ch:
				d.nodeEvent(ev)
			case <-d.done:
			}
		})
	}
}

// nodeEvent reports a held node deleted or changed by someone else (a
// release forgets the hold before it deletes the node).
func (d *Driver) nodeEvent(ev zk.Event) {
	switch ev.Type {
	case zk.EventNodeDeleted:
		d.stolen(ev.Path, 0, "was deleted by another client")
	case zk.EventNodeDataChanged:
		d.stolen(ev.Path, 0, "was overwritten by another client")
	}
}

// stolen reports the hold of path lost (of that session, if not 0).
func (d *Driver) stolen(path string, session int64, why string) {
	var lost []func(error)
	d.mu.Lock()
	for _, h := range d.holds {
		if h.path == path && !h.lost && (session == 0 || h.session == session) {
			h.lost = true
			if h.onLost != nil {
				lost = append(lost, h.onLost)
			}
		}
	}
	d.mu.Unlock()
	if len(lost) == 0 {
		return
	}
	// Not on the zk client's receiving goroutine, which must not wait.
	err := fmt.Errorf("zklock: %w: its node %s %s", backend.ErrLost, path, why)
	d.spawn(func() {
		for _, f := range lost {
			f(err)
		}
	})
}
