package zklock

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// Anyone whose ACL allows it can delete a holder's node, or overwrite it:
// an operator, or a client of a root made world-writable by someone else.
// The session still lives, so nothing else would tell the holder, and the
// next node in line holds the lock. So the driver watches each node it
// holds, and a deletion it did not make or any change of the node's data
// (the driver never changes it) is reported as a loss at once: within a
// round trip of the change, when the server's notification arrives.
//
// A driver that dialled its connection sees the notifications in its event
// callback (nodeEvent), with no goroutine per lock; one made by New, on the
// caller's connection, waits for each on a goroutine of its own while the
// lock is held.

// watchDelay is how long a lock is held before its node is watched. A
// lock released sooner is never watched: its cycle costs the create and
// the delete alone, and the watch's read is not queued on the session
// ahead of the release. A change in the first watchDelay of a hold is
// seen when the watch is set (the read finds the node gone or changed),
// or by the release, which finds the node gone.
const watchDelay = 10 * time.Millisecond

// watchHeld watches the node of h, a lock just granted, in the background,
// once it has been held for watchDelay (see stopWatch).
func (d *Driver) watchHeld(h *held) {
	path, session := h.path, h.session
	h.watch = time.AfterFunc(watchDelay, func() {
		d.mu.Lock()
		lost := h.lost
		d.mu.Unlock()
		if lost || d.conn.SessionID() != session {
			return // reported already, or by the session's monitor
		}
		d.watchNow(path, session)
	})
}

// stopWatch cancels the watch of h, released, if it was not set yet.
func (h *held) stopWatch() {
	if h.watch != nil {
		h.watch.Stop()
	}
}

// watchNow sets the watch of a held node, in the background.
func (d *Driver) watchNow(path string, session int64) {
	d.spawn(func() {
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
