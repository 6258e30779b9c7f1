package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// A lock, a semaphore and a read-write lock are each a queue of
// sequential nodes (backend.Queuer): Enqueue creates the claim's node and
// looks where it stands, Ticket.Wait watches what is in its way and looks
// again when that changes, Ticket.Leave deletes the node.

// QueueModes implements backend.Queuer: every mode queues.
func (d *Driver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Enqueue implements backend.Queuer. A node alone in its queue holds, as
// the create's answer says: a free lock costs one request.
func (d *Driver) Enqueue(ctx context.Context, l backend.Claim) (backend.Grant, backend.Ticket, error) {
	g, t, err := d.join(ctx, l, "acquire", true)
	if t == nil {
		return g, nil, err
	}
	return g, t, err
}

// join creates l's node and looks once: the Grant when it holds, else its
// ticket, with the look's error if any. waits: an Enqueue's, whose
// requests count as store tries and wait for a settled session.
func (d *Driver) join(ctx context.Context, l backend.Claim, op string, waits bool) (_ backend.Grant, t *ticket, err error) {
	defer func() { err = permitted(err) }()
	if l.Mode != backend.Exclusive {
		if err := checkShared(l); err != nil {
			return backend.Grant{}, nil, fmt.Errorf("zklock: %s: %w", op, err)
		}
		if l.Delay > 0 {
			return backend.Grant{}, nil, fmt.Errorf("zklock: %s: LockDelay on a %v: %w: only locks keep a delay", op, l.Mode, backend.ErrUnsupported)
		}
	}
	ctx, done, err := d.enter(ctx, op)
	if err != nil {
		return backend.Grant{}, nil, err
	}
	defer done()
	// An error comes with a ticket when the node may exist (the answer was
	// lost, or the caller left): its look finds it, its Leave deletes it.
	es, err := creating(ctx, d, func(ctx context.Context, inline bool) ([]*entry, error) {
		return d.create(ctx, []backend.Claim{l}, waits, inline)
	})
	if es != nil {
		t = &ticket{d: d, l: l, e: es[0], waits: waits}
	}
	if err == nil {
		var g backend.Grant
		if g, err = t.look(ctx); err == nil {
			return g, nil, nil
		}
		if errors.Is(err, backend.ErrNotAcquired) {
			if waits {
				t.setWaiting(ctx)
			}
			return backend.Grant{}, t, nil
		}
	}
	return backend.Grant{}, t, t.failed(ctx, d, op, err)
}

// ticket is one claim's queue node and what its last look found in its
// way: a lock's two nodes ahead, a read-write lock's blocker (pred), each
// watched by Wait; a semaphore's watch on its queue, set by the look.
type ticket struct {
	d     *Driver
	l     backend.Claim
	e     *entry
	waits bool // an Enqueue's: counted in storeTries

	pred, pred2   string
	watch, watch2 <-chan zk.Event
	ahead         int // nodes ahead of a lock's node

	marked  bool      // the last look saw another claim's delay marker
	delayed string    // a lost lock's marker that keeps the name, until
	until   time.Time // (by the server's clock, as read)
}

// Wait implements backend.Ticket.
func (t *ticket) Wait(ctx context.Context) (_ backend.Grant, err error) {
	defer func() { err = permitted(err) }()
	ctx, done, err := t.d.enter(ctx, "acquire")
	if err != nil {
		return backend.Grant{}, err
	}
	defer done()
	g, err := backend.Grant{}, t.wait(ctx)
	if err == nil {
		g, err = t.look(ctx)
	}
	if err != nil {
		return backend.Grant{}, t.failed(ctx, t.d, "acquire", err)
	}
	return g, nil
}

// probePeriod is how often a waiter checks its connection (see wait).
const probePeriod = 200 * time.Millisecond

// wait blocks until what the last look found in t's way changes; at once
// when nothing is to be watched (held, a failed look, a node gone).
func (t *ticket) wait(ctx context.Context) error {
	d, e := t.d, t.e
	if t.delayed != "" {
		return t.waitDelay(ctx)
	}
	if e.first || e.name == "" || t.pred == "" && t.watch == nil {
		return nil
	}
	if t.watch == nil {
		if d.testHookWatch != nil {
			d.testHookWatch()
		}
		ch, err := d.watch(ctx, e, t.pred)
		if err != nil || ch == nil {
			return err // nil: gone meanwhile, look again
		}
		t.watch = ch
	}
	if t.watch2 == nil && t.pred2 != "" {
		ch, err := d.watch(ctx, e, t.pred2)
		switch {
		case errors.Is(err, errGone), err == nil && ch == nil:
			return err
		case err == nil:
			t.watch2 = ch
		} // else wait without it
	}
	probe := time.NewTicker(probePeriod)
	defer probe.Stop()
	for {
		select {
		case ev := <-t.watch:
			t.pred, t.watch = "", nil
			if ev.Type == zk.EventNodeDeleted && t.ahead == 1 && !t.marked {
				// The only node ahead is gone, and none can sort before
				// ours: first (unless a delay marker was left in our way).
				e.first = true
			}
			return watchEnded(ev)
		case ev := <-t.watch2:
			t.pred2, t.watch2 = "", nil
			return watchEnded(ev)
		case <-probe.C:
			// Watches and the node survive a disconnect, as long as the
			// session: look again, which waits for a session.
			if d.conn.State() != zk.StateHasSession {
				return nil
			}
		case <-ctx.Done():
			return d.gate.Failed(ctx, ctx.Err())
		}
	}
}

// watchEnded is the wait's end by ev: nil for a change to look at.
func watchEnded(ev zk.Event) error {
	switch {
	case ev.Type != zk.EventNotWatching:
		return nil
	case errors.Is(ev.Err, zk.ErrSessionExpired):
		return errGone
	}
	return fmt.Errorf("%w (connection closed while waiting)", backend.ErrClosed)
}

// look is one look at where t's node stands: the Grant when it holds,
// else ErrNotAcquired, having noted what to watch. A node whose create's
// answer was lost is found first.
func (t *ticket) look(ctx context.Context) (backend.Grant, error) {
	d := t.d
	if !d.settled(ctx) {
		return backend.Grant{}, errNoSession
	}
	if t.e.name == "" {
		parent, head := d.queueParent(t.l), queueHead(t.l)
		e, err := call(ctx, d, func() (*entry, error) { return d.find(parent, head, t.e.hash) })
		switch {
		case err != nil:
			return backend.Grant{}, err
		case e == nil:
			return backend.Grant{}, errGone
		}
		d.log.Debug("zklock: found the node of a lost create response", "path", e.path())
		e.marked = d.marks(t.l) // made in the same request
		t.e = e
	}
	if !t.e.first {
		if t.waits {
			d.tries.Add(1) // a look that may find the node holding (storeTries)
		}
		if held, err := t.stand(ctx); err != nil || !held {
			if err == nil {
				err = backend.ErrNotAcquired
			}
			return backend.Grant{}, err
		}
		t.e.first = true // holds: no need to be first
	}
	return d.grant(ctx, t.e, t.l)
}

// stand lists t's queue: whether its node holds, else what is in its way.
func (t *ticket) stand(ctx context.Context) (bool, error) {
	d, e := t.d, t.e
	if t.l.Mode != backend.Exclusive {
		// A semaphore's waiter watches the queue's children: any node
		// ahead that goes may free its permit.
		lk, err := d.sharedListing(ctx, e.parent, t.l.Mode, e, t.waits && t.l.Mode == backend.Permit)
		if err != nil {
			return false, err
		}
		st, err := standingIn(lk.names, lk.r, e, t.l) // no names: errGone
		switch {
		case err != nil:
			return false, err
		case st.mismatch != nil:
			return false, st.mismatch
		}
		if t.l.Mode == backend.Permit {
			t.watch = lk.ch
		} else if st.block != t.pred {
			t.pred, t.watch = st.block, nil
		}
		return st.held, nil
	}
	nodes, markers, err := d.listing(ctx, e.parent)
	if err != nil {
		return false, err
	}
	i := slices.IndexFunc(nodes, func(n qnode) bool { return n.name == e.name })
	if i < 0 {
		return false, errGone
	}
	// Whether it saw another claim's delay marker than e's own.
	t.marked, t.delayed = len(markers) > 0 && (!e.marked || len(markers) > 1), ""
	if i == 0 {
		for _, m := range deadMarkers(nodes, markers) {
			left, err := d.judgeMarker(ctx, e.parent, m, e.fence)
			if err != nil {
				return false, err
			}
			if left > 0 {
				t.delayed, t.until = m, time.Now().Add(left)
				return false, nil
			}
		}
	}
	// Watched: the node just ahead, and the one ahead of that.
	var p, p2 string
	if i > 0 {
		p = nodes[i-1].name
	}
	if i > 1 {
		p2 = nodes[i-2].name
	}
	if p != t.pred {
		t.pred, t.watch = p, nil
	}
	if p2 != t.pred2 {
		t.pred2, t.watch2 = p2, nil
	}
	t.ahead = i
	return i == 0, nil
}

// failed is the error of an Enqueue or Wait that failed with err (t nil:
// no node made); a node gone is backend.ErrRequeue, with why.
func (t *ticket) failed(ctx context.Context, d *Driver, op string, err error) error {
	if errors.Is(err, errGone) && t != nil && ctx.Err() == nil {
		err = d.goneErr(t.e)
	}
	return fmt.Errorf("zklock: %s: %w", op, d.gate.Failed(ctx, err))
}

// Leave implements backend.Ticket: it deletes the node, which frees the
// key if the node holds it, waiting quickWait at most: on a dead
// connection, the delete goes on in the background while the session may.
func (t *ticket) Leave(ctx context.Context) error {
	d := t.d
	d.unhold(t.l.Token, t.e.path())
	timer := time.NewTimer(d.quickWait())
	defer timer.Stop()
	select {
	case <-d.abandonAsync(t.e):
	case <-timer.C:
	case <-ctx.Done():
	}
	return nil
}

// confirm makes sure the node's session was in touch with the server
// lately, as the holder times the lock from that contact: a watch set
// again after a reconnection may fire before any request on the resumed
// session. If not, one read of the node, which also proves it is there.
func (d *Driver) confirm(ctx context.Context, e *entry) error {
	if at := d.contactOf(e.session); !at.IsZero() && time.Since(at) < d.pingPeriod() {
		return nil
	}
	ours, err := callInline(ctx, d, func() (bool, error) {
		return request(d, func() (bool, error) {
			ok, st, err := d.conn.Exists(e.path())
			return ok && st.EphemeralOwner == e.session, err
		})
	})
	if err == nil && !ours {
		return errGone
	}
	return err
}

// goneErr explains why our queue node disappeared.
func (d *Driver) goneErr(e *entry) error {
	switch {
	case d.conn.SessionID() != e.session:
		return fmt.Errorf("%w: %w (its queue node is gone)", backend.ErrRequeue, ErrSessionExpired)
	case e.name == "":
		return fmt.Errorf("%w: the create's answer was lost, and it made no node", backend.ErrRequeue)
	}
	return fmt.Errorf("%w: the queue node %s was deleted by someone else", backend.ErrRequeue, e.path())
}

// grant records e as held by l.Token.
func (d *Driver) grant(ctx context.Context, e *entry, l backend.Claim) (backend.Grant, error) {
	check := d.confirm
	if e.waiting {
		check = func(ctx context.Context, e *entry) error { return d.setHeld(ctx, e, l) }
	}
	if err := check(ctx, e); err != nil {
		return backend.Grant{}, err
	}
	if d.conn.SessionID() != e.session {
		return backend.Grant{}, errGone
	}
	h := &held{path: e.path(), marker: e.marker(), session: e.session, onLost: l.OnLost}
	d.mu.Lock()
	d.holds[l.Token] = h
	d.watchHeld(h)
	d.mu.Unlock()
	sid := e.session
	return backend.Grant{Fence: e.fence, TTL: max(l.TTL, d.ttl), SessionTTL: d.ttl, Contact: func() time.Time { return d.contactOf(sid) }}, nil
}

// waitDelay waits until the marker in t's way is due, by the server's
// clock, or goes or changes before.
func (t *ticket) waitDelay(ctx context.Context) error {
	d, path, until := t.d, t.e.parent+"/"+t.delayed, t.until
	t.delayed = ""
	ch, err := call(ctx, d, func() (<-chan zk.Event, error) {
		ok, _, ch, err := d.conn.ExistsW(path)
		if !ok {
			ch = nil // gone
		}
		return ch, err
	})
	if err != nil || ch == nil {
		return err
	}
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
	case <-ctx.Done():
		return d.gate.Failed(ctx, ctx.Err())
	}
	return nil
}

// watch sets a watch on node name of e's queue; a nil channel: the node
// is gone; errGone: e's session ended before the watch was set. A request
// held while the zk client reconnects goes on whatever session it then
// has, and a watch set on a new session never hears of e's session's end:
// the session must be e's after the answer (ids only move forward).
func (d *Driver) watch(ctx context.Context, e *entry, name string) (<-chan zk.Event, error) {
	return callInline(ctx, d, func() (<-chan zk.Event, error) {
		// GetW, not ExistsW: no watch on a missing node, which would
		// never fire (sequence numbers are not reused) and pile up.
		_, _, ch, err := d.conn.GetW(e.parent + "/" + name)
		if d.conn.SessionID() != e.session {
			return nil, errGone
		}
		if errors.Is(err, zk.ErrNoNode) {
			return nil, nil
		}
		return ch, err
	})
}
