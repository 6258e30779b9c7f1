package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// Acquire queues a node for l.Key and waits, watching only the node just
// ahead of it, until it is first: waiters are served in arrival order.
func (d *Driver) Acquire(ctx context.Context, l backend.Claim) (_ backend.Grant, err error) {
	defer func() { err = permitted(err) }()
	if d.isClosed() {
		return backend.Grant{}, d.closedErr("acquire")
	}
	e, err := d.enqueue(ctx, l, 0)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", err)
	}
	// Each waiter watches the node just ahead of it and the one ahead of
	// that: still no herd (a deletion wakes at most two waiters), and when
	// the second one goes, the waiter lists the queue while its predecessor
	// takes the lock, so that it knows it is next and takes the lock at
	// the news of its predecessor's deletion, without listing again.
	var (
		retry           = newBackoff()
		pred, pred2     string // the nodes watched
		predCh, pred2Ch <-chan zk.Event
		ahead           int
	)
	for !e.first {
		p, p2, n, err := d.predecessor(ctx, e)
		ahead = n
		if err == nil && p == "" {
			e.first = true
			break
		}
		if err == nil && p != pred {
			pred, predCh = "", nil
			if d.testHookWatch != nil {
				d.testHookWatch()
			}
			var ch <-chan zk.Event
			if ch, err = d.watch(ctx, e, p); err == nil && ch == nil {
				continue // gone meanwhile: look again
			}
			if err == nil {
				pred, predCh = p, ch
			}
		}
		if err == nil && p2 != pred2 {
			pred2, pred2Ch = "", nil
			if p2 != "" {
				ch, werr := d.watch(ctx, e, p2)
				if werr == nil && ch == nil {
					continue
				}
				if errors.Is(werr, errGone) {
					err = werr
				} else if werr == nil { // else wait without it
					pred2, pred2Ch = p2, ch
				}
			}
		}
		if err == nil {
			var ev zk.Event
			select {
			case ev = <-predCh:
				pred, predCh = "", nil
				if ev.Type == zk.EventNodeDeleted && ahead == 1 {
					// The only node ahead of ours is gone, and no new
					// node can sort before ours: we are first.
					e.first = true
					continue
				}
			case ev = <-pred2Ch:
				pred2, pred2Ch = "", nil
			case <-ctx.Done():
				d.abandon(ctx, e)
				return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", context.Cause(ctx))
			case <-d.done:
				d.abandon(ctx, e)
				return backend.Grant{}, d.closedErr("acquire")
			}
			switch {
			case ev.Type != zk.EventNotWatching:
				continue
			case errors.Is(ev.Err, zk.ErrSessionExpired):
				d.abandon(ctx, e)
				return backend.Grant{}, fmt.Errorf("zklock: acquire: %w while waiting (its queue node is gone)", ErrSessionExpired)
			default:
				d.abandon(ctx, e)
				return backend.Grant{}, fmt.Errorf("zklock: acquire: %w (connection closed while waiting)", backend.ErrClosed)
			}
		}
		switch {
		case errors.Is(err, errGone):
			d.abandon(ctx, e)
			return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", d.goneErr(e))
		case ctx.Err() != nil:
			d.abandon(ctx, e)
			return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", context.Cause(ctx))
		case d.isClosed():
			d.abandon(ctx, e)
			return backend.Grant{}, d.closedErr("acquire")
		case transient(err):
			// A disconnect: our node lives as long as the session does.
			if !retry.sleep(ctx.Done(), d.done) {
				d.abandon(ctx, e)
				if ctx.Err() != nil {
					return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", context.Cause(ctx))
				}
				return backend.Grant{}, d.closedErr("acquire")
			}
		default:
			d.abandon(ctx, e)
			return backend.Grant{}, fmt.Errorf("zklock: acquire: %w", err)
		}
	}
	return d.grant(ctx, e, l, "acquire")
}

// goneErr explains why our queue node disappeared.
func (d *Driver) goneErr(e *entry) error {
	if d.conn.SessionID() != e.session {
		return fmt.Errorf("%w while waiting (its queue node is gone)", ErrSessionExpired)
	}
	return fmt.Errorf("%w: the queue node %s was deleted by someone else", backend.ErrNotAcquired, e.path())
}

// grant records e as held by l.Token.
func (d *Driver) grant(ctx context.Context, e *entry, l backend.Claim, op string) (backend.Grant, error) {
	if d.conn.SessionID() != e.session {
		d.abandon(ctx, e)
		return backend.Grant{}, fmt.Errorf("zklock: %s: %w", op, d.goneErr(e))
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.abandon(ctx, e)
		return backend.Grant{}, d.closedErr(op)
	}
	d.holds[l.Token] = &held{path: e.path(), session: e.session, fence: e.fence, onLost: l.OnLost}
	d.mu.Unlock()
	d.watchHeld(e.path(), e.session)
	sid := e.session
	return backend.Grant{Fence: e.fence, TTL: max(l.TTL, d.ttl), SessionTTL: d.ttl, Contact: func() time.Time { return d.contactOf(sid) }}, nil
}

// predecessor lists the queue and returns the node just ahead of e ("" when
// e is first), the one ahead of that, and how many nodes are ahead of e.
func (d *Driver) predecessor(ctx context.Context, e *entry) (pred, pred2 string, ahead int, err error) {
	names, err := d.children(ctx, e.parent)
	if errors.Is(err, zk.ErrNoNode) {
		return "", "", 0, errGone
	}
	if err != nil {
		return "", "", 0, err
	}
	found := false
	predSeq, pred2Seq := int64(-1), int64(-1)
	for _, n := range names {
		_, seq, ok := parseNode(n)
		switch {
		case !ok:
		case n == e.name:
			found = true
		case seq < e.seq:
			ahead++
			if seq > predSeq {
				pred2, pred2Seq = pred, predSeq
				pred, predSeq = n, seq
			} else if seq > pred2Seq {
				pred2, pred2Seq = n, seq
			}
		}
	}
	if !found {
		return "", "", 0, errGone
	}
	return pred, pred2, ahead, nil
}
