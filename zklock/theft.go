package zklock

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// Theft watches: the driver watches each node it holds and reports a
// deletion or change it did not make as a loss at once (see
// docs/backends/zklock.md, Theft watches).

// watchDelay is how long a lock is held before its node is watched. A
// lock released sooner is never watched: its cycle costs the create and
// the delete alone, and the watch's read is not queued on the session
// ahead of the release. A change in the first watchDelay of a hold is
// seen when the watch is set (the read finds the node gone or changed),
// or by the release, which finds the node gone.
const watchDelay = 10 * time.Millisecond

// maxWatchers bounds the goroutines that set theft watches at once. The
// holds to watch wait in a queue, in grant order (so in order of when
// they are due), behind one timer: no timer or goroutine per lock, and
// none at all while no watch is due. A burst of grants is watched by up
// to maxWatchers requests in flight, which the zk client pipelines.
const maxWatchers = 4

// watchQueue is the holds whose node is not watched yet (under d.mu).
type watchQueue struct {
	holds    []*held     // FIFO by due time
	timer    *time.Timer // fires when the first is due (watchFire)
	armed    bool        // timer set, its callback not yet run
	watchers int         // goroutines watching
}

// watchHeld queues h, a lock just granted, to have its node watched once
// it has been held for watchDelay. d.mu is held.
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

// unwatch takes h, released or lost, out of the watch queue if it is
// still there, and stops the timer when nothing is left to watch. d.mu is
// held.
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

// watchLoop watches the due holds of the queue, one at a time, starting
// another watcher (up to maxWatchers) while more are due; it ends when
// the queue is empty or its first hold is not due yet (then the timer is
// set for it). It is counted in d.watches.watchers.
func (d *Driver) watchLoop() {
	q := &d.watches
	d.mu.Lock()
	for {
		var h *held
		for len(q.holds) > 0 && h == nil {
			if q.holds[0].done {
				q.holds[0].queued = false
				q.holds[0] = nil
				q.holds = q.holds[1:]
				continue
			}
			if wait := time.Until(q.holds[0].due); wait > 0 {
				if !q.armed && !d.stopped {
					q.armed = true
					q.timer.Reset(wait)
				}
				break
			}
			h = q.holds[0]
			h.queued = false
			q.holds[0] = nil
			q.holds = q.holds[1:]
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

// watchNow sets the watch of a held node. On a connection the driver
// dialed, nodeEvent sees its notification; on the caller's, a goroutine
// waits for it while the lock is held.
func (d *Driver) watchNow(path string, session int64) {
	if d.testHookHeldWatch != nil {
		d.testHookHeldWatch()
	}
	// GetW, not ExistsW: a node released meanwhile must not leave a
	// watch that never fires (a sequence number is never reused).
	_, st, ch, err := d.conn.GetW(path)
	ok := !errors.Is(err, zk.ErrNoNode)
	if !ok {
		err = nil
	}
	switch {
	case err != nil:
		// The connection is in trouble: the session's monitor
		// reports what becomes of the lock.
		return
	case !ok:
		d.stolen(path, session, "was deleted")
		return
	case st.Version != 0 || st.EphemeralOwner != session:
		// Changed between the grant and the watch.
		d.stolen(path, session, "was overwritten")
		return
	case d.own:
		return // nodeEvent sees the notification
	}
	d.spawn(func() {
		select {
		case ev := <-ch:
			d.nodeEvent(ev)
		case <-d.done:
		}
	})
}

// nodeEvent reports a held node deleted or changed by someone else. A
// release takes the hold away before it deletes the node, so the driver's
// own deletions are not reported.
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
	// Not on the zk client's receiving goroutine, which the callbacks
	// must not hold up.
	err := fmt.Errorf("zklock: %w: its node %s %s", backend.ErrLost, path, why)
	d.spawn(func() {
		for _, f := range lost {
			f(err)
		}
	})
}
