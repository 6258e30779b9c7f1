package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// Acquire queues a node for l.Key and waits, watching only the node just
// ahead of it, until it is first: waiters are served in arrival order.
//
// It rides out store failures: a connection down (the zk client
// reconnects, to any server of the ensemble) and requests failing with it,
// for up to backend.StoreFailureBudget of failures in a row, after which
// it returns the store's error; a session that expired meanwhile (its node
// went with it) is met by queueing again on the new one, at the back.
// Refusals (an ACL) end it at once.
func (d *Driver) Acquire(ctx context.Context, l backend.Claim) (_ backend.Grant, err error) {
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "acquire")
	if err != nil {
		return backend.Grant{}, err
	}
	defer done()
	if l.Mode != backend.Exclusive {
		return d.acquireShared(ctx, l)
	}
	t := &tries{budget: retry.Budget}
	for {
		e, err := d.enqueue(ctx, l, t)
		if err != nil {
			return backend.Grant{}, fmt.Errorf("zklock: %w", err)
		}
		if err = d.await(ctx, e, t); err == nil {
			err = d.confirm(ctx, e, t)
		}
		if err != nil {
			err = fmt.Errorf("zklock: %w", err)
		} else {
			var g backend.Grant
			if g, err = d.grant(ctx, e, l, "acquire"); err == nil {
				return g, nil
			}
		}
		if !errors.Is(err, ErrSessionExpired) || t.fail(time.Now()) {
			return backend.Grant{}, err
		}
		d.log.Debug("zklock: the session expired while waiting; queueing again", "key", l.Key)
	}
}

// probePeriod is how often a waiter looks at its connection while it
// waits: a connection down for the failure budget ends the wait.
const probePeriod = 200 * time.Millisecond

// await waits until e is first. Each waiter watches the node just ahead of
// it and the one ahead of that: still no herd (a deletion wakes at most
// two waiters), and when the second one goes, the waiter lists the queue
// while its predecessor takes the lock, so that it knows it is next and
// takes the lock at the news of its predecessor's deletion, without
// listing again. On an error, e is abandoned; an error wrapping
// ErrSessionExpired means that e's session ended.
func (d *Driver) await(ctx context.Context, e *entry, t *tries) error {
	var (
		bo              = newBackoff()
		pred, pred2     string // the nodes watched
		predCh, pred2Ch <-chan zk.Event
		ahead           int
		probe           *time.Ticker
	)
	defer func() {
		if probe != nil {
			probe.Stop()
		}
	}()
	for !e.first {
		sent := time.Now()
		if !d.settled(ctx) {
			if err := d.waitFailed(ctx, e, errNoSession, t, sent, bo); err != nil {
				return err
			}
			continue
		}
		d.tries.Add(1) // a re-check that may find e first (storeTries)
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
			t.ok()
			bo.Reset()
			e.waited = true
			if probe == nil {
				probe = time.NewTicker(probePeriod)
			}
			var ev zk.Event
			fromPred := false
		wait:
			for {
				select {
				case ev = <-predCh:
					pred, predCh, fromPred = "", nil, true
					break wait
				case ev = <-pred2Ch:
					pred2, pred2Ch = "", nil
					break wait
				case now := <-probe.C:
					// Watches survive a disconnect (the zk client sets
					// them again on the session's next connection): only
					// a connection down for the budget ends the wait.
					if st := d.conn.State(); st == zk.StateHasSession {
						t.ok()
					} else if t.fail(now) {
						d.abandonQuick(e)
						return fmt.Errorf("%w: no session with ZooKeeper for %v (state %v)", zk.ErrNoServer, t.budget, st)
					}
				case <-ctx.Done():
					d.abandon(ctx, e)
					return d.ended(ctx)
				}
			}
			if fromPred && ev.Type == zk.EventNodeDeleted && ahead == 1 {
				// The only node ahead of ours is gone, and no new node
				// can sort before ours: we are first.
				e.first = true
				continue
			}
			if err := d.watchEnded(ctx, e, ev); err != nil {
				return err
			}
			continue
		}
		if err := d.waitFailed(ctx, e, err, t, sent, bo); err != nil {
			return err
		}
	}
	return nil
}

// confirm makes sure that the lock's session was in touch with the server
// lately, as its holder will time the lock from that contact: after a
// reconnection, a waiter may learn that it is first from a watch the zk
// client set again, before the driver sent a request on the resumed
// session. Then one read of its node, which also proves it is still there.
func (d *Driver) confirm(ctx context.Context, e *entry, t *tries) error {
	if at := d.contactOf(e.session); !at.IsZero() && time.Since(at) < d.pingPeriod() {
		return nil
	}
	type node struct {
		ok bool
		st *zk.Stat
	}
	bo := newBackoff()
	for {
		sent := time.Now()
		err := errNoSession
		if d.settled(ctx) {
			var n node
			n, err = callInline(ctx, d, func() (node, error) {
				return request(d, func() (node, error) {
					ok, st, err := d.conn.Exists(e.path())
					return node{ok, st}, err
				})
			})
			switch {
			case err == nil && n.ok && n.st.EphemeralOwner == e.session:
				t.ok()
				return nil
			case err == nil:
				d.abandon(ctx, e)
				return d.goneErr(e)
			case ctx.Err() != nil:
				d.abandon(ctx, e)
				return d.ended(ctx)
			case !transient(err):
				d.abandon(ctx, e)
				return err
			}
		}
		if t.fail(sent) {
			d.abandonQuick(e)
			return err
		}
		if !pause(ctx, bo) {
			d.abandon(ctx, e)
			return d.ended(ctx)
		}
	}
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
	h := &held{path: e.path(), session: e.session, fence: e.fence, onLost: l.OnLost}
	d.mu.Lock()
	d.holds[l.Token] = h
	d.watchHeld(h)
	d.mu.Unlock()
	sid := e.session
	return backend.Grant{Fence: e.fence, TTL: max(l.TTL, d.ttl), SessionTTL: d.ttl, Contact: func() time.Time { return d.contactOf(sid) }, Waited: e.waited}, nil
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

// watchEnded says why a wait ends after its watch delivered ev, or nil
// when ev is a change to look at.
func (d *Driver) watchEnded(ctx context.Context, e *entry, ev zk.Event) error {
	if ev.Type != zk.EventNotWatching {
		return nil
	}
	d.abandon(ctx, e)
	if errors.Is(ev.Err, zk.ErrSessionExpired) {
		return fmt.Errorf("%w while waiting (its queue node is gone)", ErrSessionExpired)
	}
	return fmt.Errorf("%w (connection closed while waiting)", backend.ErrClosed)
}

// waitFailed says why a wait ends after a failed call made at sent, or nil
// to look again: a disconnect within the budget, after a pause, since our
// node lives as long as the session does.
func (d *Driver) waitFailed(ctx context.Context, e *entry, err error, t *tries, sent time.Time, bo *retry.Backoff) error {
	switch {
	case errors.Is(err, errGone):
		d.abandon(ctx, e)
		return d.goneErr(e)
	case ctx.Err() != nil:
		d.abandon(ctx, e)
		return d.ended(ctx)
	case transient(err):
		if t.fail(sent) {
			d.abandonQuick(e)
			return err
		}
		if !pause(ctx, bo) {
			d.abandon(ctx, e)
			return d.ended(ctx)
		}
		return nil
	default:
		d.abandon(ctx, e)
		return err
	}
}
