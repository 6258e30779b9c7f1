package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// A semaphore and a read-write lock are queues like a lock's, under nodes
// "sem~NAME" and "rw~NAME" beside the lock's, of nodes tagged "p<limit>"
// (or "p<limit>x<permits>"), "r" or "w" (see docs/backends/zklock.md,
// Semaphores and read-write locks).

// Modes implements backend.Modal: semaphores and read-write locks.
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher: a permit node's tag has its weight.
func (d *Driver) Weighs() bool { return true }

// queueParent is the node of l's queue (a lock's: parentPath).
func (d *Driver) queueParent(l backend.Claim) string {
	return d.root + "/" + objectHead(l.Mode) + backend.EscapeKey(l.Key)
}

// objectHead starts the names of m's objects' nodes (none for a lock's).
func objectHead(m backend.Mode) string {
	switch backend.Object(m) {
	case backend.Permit:
		return "sem~"
	case backend.Read:
		return "rw~"
	}
	return ""
}

// queueHead is the start of l's node names: its tag and a dash.
func queueHead(l backend.Claim) string {
	switch l.Mode {
	case backend.Exclusive:
		return nodePrefix
	case backend.Permit:
		return permitTag(l.Limit, max(l.Weight, 1)) + "-"
	case backend.Read:
		return "r-"
	}
	return "w-"
}

// checkShared refuses a claim no node could express, before any request.
func checkShared(l backend.Claim) error {
	switch l.Mode {
	case backend.Permit:
		if l.Limit < 1 || l.Limit > backend.MaxLimit || l.Weight > l.Limit {
			return fmt.Errorf("%w: %d of %d permits", backend.ErrInvalidLimit, max(l.Weight, 1), l.Limit)
		}
	case backend.Read, backend.Write:
	default:
		return fmt.Errorf("mode %v: %w", l.Mode, backend.ErrUnsupported)
	}
	return nil
}

// snode is one node of a shared queue, parsed.
type snode struct {
	name string
	tag  string
	seq  int64
}

// standing is where a node stands in its queue.
type standing struct {
	held     bool   // it holds its permit, or its side of the lock
	mismatch error  // a permit asked with another limit than the holders'
	block    string // a read-write lock's waiter: the node whose deletion may let it in
}

// standingIn is where e stands among its queue's names, with its
// semaphore's resize record r (errGone when not among them).
func standingIn(names []string, r *resized, e *entry, l backend.Claim) (standing, error) {
	var ahead []snode // in no order
	found := false
	for _, n := range names {
		tag, _, seq, ok := parseTagged(n)
		switch {
		case !ok:
		case n == e.name:
			found = true
		case seq < e.seq:
			ahead = append(ahead, snode{n, tag, seq})
		}
	}
	switch {
	case !found:
		return standing{}, errGone
	case l.Mode == backend.Permit:
		return permitStanding(ahead, e.seq, r, l.Limit, max(l.Weight, 1)), nil
	}
	return rwStanding(ahead, l.Mode), nil
}

// sharedList is a shared queue's children, resize record and watch.
type sharedList struct {
	names []string
	r     *resized
	ch    <-chan zk.Event
}

// sharedListing lists the queue under parent of an object of mode m (no
// names when its node does not exist) and reads a semaphore's resize
// record. For the look of e, its node, it deletes a record that keeps
// nothing (forgetInert) and, with watch, watches the queue's children.
func (d *Driver) sharedListing(ctx context.Context, parent string, m backend.Mode, e *entry, watch bool) (sharedList, error) {
	lk, err := call(ctx, d, func() (lk sharedList, err error) {
		if !watch {
			lk.names, _, err = d.conn.Children(parent)
		} else {
			lk.names, _, lk.ch, err = d.conn.ChildrenW(parent)
			// As in watch: a watch set on another session than e's
			// would never hear of e's session's end.
			if d.conn.SessionID() != e.session {
				return sharedList{}, errGone
			}
		}
		if err == nil && m == backend.Permit {
			if lk.r, err = d.readResized(parent, lk.names); err == nil && e != nil {
				d.forgetInert(parent, lk.names, lk.r)
			}
		}
		return lk, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return sharedList{}, nil
	}
	return lk, err
}
