package zklock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// A lock node is named "lk-" + the hash of its token + "-" + the sequence
// number ZooKeeper appends: the hash finds a node whose create response was
// lost (a protected create), and proves that a token owns a node without
// showing the token to anyone who lists the queue.
const (
	nodePrefix = "lk-"
	hashLen    = 32
	nameHead   = len(nodePrefix) + hashLen + 1
)

// errGone: our queue node is not there any more.
var errGone = errors.New("queue node gone")

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte("zklock\x00" + token))
	return hex.EncodeToString(sum[:hashLen/2])
}

// parseNode splits a child name into its token hash and sequence number;
// ok is false for nodes that are not ours.
func parseNode(name string) (hash string, seq int64, ok bool) {
	if len(name) <= nameHead || !strings.HasPrefix(name, nodePrefix) || name[nameHead-1] != '-' {
		return "", 0, false
	}
	seq, err := strconv.ParseInt(name[nameHead:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return name[len(nodePrefix) : nameHead-1], seq, true
}

// entry is one queue node.
type entry struct {
	parent  string
	name    string
	seq     int64
	first   bool   // known to be the lowest node
	fence   uint64 // the node's creation zxid
	session int64  // the session that owns it
}

func (e *entry) path() string { return e.parent + "/" + e.name }

// held is a granted lock.
type held struct {
	path    string
	session int64
	fence   uint64
	onLost  func(error)
	lost    bool
}

func (d *Driver) parentPath(key string) string { return d.root + "/" + backend.EscapeKey(key) }

// permitted marks a refusal by an ACL (zk.ErrNoAuth) as the permanent
// backend.ErrPermission, keeping its text.
func permitted(err error) error {
	if errors.Is(err, zk.ErrNoAuth) && !errors.Is(err, backend.ErrPermission) {
		return permError{err}
	}
	return err
}

type permError struct{ error }

func (e permError) Unwrap() []error { return []error{e.error, backend.ErrPermission} }

// transient reports whether err means "could not tell, try again".
func transient(err error) bool {
	return connLost(err) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrSessionMoved)
}

// connLost reports whether a request failed with its connection, so that
// the server may or may not have run it. The zk client reports a request
// whose write failed with the write's own error, not ErrConnectionClosed.
func connLost(err error) bool {
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) || errors.As(err, &ne)
}

func (d *Driver) closedErr(op string) error {
	return fmt.Errorf("zklock: %s: %w", op, backend.ErrClosed)
}

// call runs f, a blocking zk call, so that ctx can end the wait; f runs to
// completion in a goroutine Close waits for.
func call[T any](ctx context.Context, d *Driver, f func() (T, error)) (T, error) {
	var zero T
	if ctx.Done() == nil {
		return f()
	}
	if err := ctx.Err(); err != nil {
		return zero, context.Cause(ctx)
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	if !d.spawn(func() {
		v, err := f()
		ch <- result{v, err}
	}) {
		return zero, backend.ErrClosed
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, context.Cause(ctx)
	}
}

type children struct {
	names []string
}

func (d *Driver) children(ctx context.Context, parent string) ([]string, error) {
	r, err := call(ctx, d, func() (children, error) {
		names, _, err := d.conn.Children(parent)
		return children{names}, err
	})
	return r.names, err
}

// TryAcquire takes l.Key if nobody holds it or waits for it: it queues a
// node and, unless the node is first, deletes it again.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (_ backend.Grant, err error) {
	defer func() { err = permitted(err) }()
	if d.isClosed() {
		return backend.Grant{}, d.closedErr("try-acquire")
	}
	e, err := d.enqueue(ctx, l, 3)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("zklock: try-acquire: %w", err)
	}
	if !e.first {
		pred, _, _, err := d.predecessor(ctx, e)
		if err != nil {
			d.abandon(ctx, e)
			if errors.Is(err, errGone) {
				err = d.goneErr(e)
			}
			return backend.Grant{}, fmt.Errorf("zklock: try-acquire: %w", err)
		}
		if pred != "" {
			d.abandon(ctx, e)
			return backend.Grant{}, fmt.Errorf("zklock: try-acquire: %w", backend.ErrNotAcquired)
		}
	}
	return d.grant(ctx, e, l, "try-acquire")
}

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

// watch sets a watch on node name of e's queue; a nil channel means the
// node is gone. errGone means e's session ended before the watch was set.
//
// A request that the zk client holds while it reconnects is sent on
// whatever session it then has. Set on a new session, the watch outlives
// e's node, and the zk client never reports the old session's expiry to
// it: the waiter would wait for a predecessor that may never go. So the
// session must be e's after the answer (ids only move forward: it was e's
// all along).
func (d *Driver) watch(ctx context.Context, e *entry, name string) (<-chan zk.Event, error) {
	return call(ctx, d, func() (<-chan zk.Event, error) {
		// GetW, not ExistsW: it sets no watch on a missing node, which
		// would never fire (sequence numbers are not reused) and pile up.
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

// enqueue creates l's queue node. maxTransient bounds the attempts that
// fail for want of a connection (0: until ctx ends). On an error it leaves
// no node behind.
func (d *Driver) enqueue(ctx context.Context, l backend.Claim, maxTransient int) (*entry, error) {
	parent := d.parentPath(l.Key)
	hash := tokenHash(l.Token)
	data := []byte(l.Owner)
	if ctx.Done() == nil {
		return d.create(parent, hash, data, maxTransient, nil)
	}
	type result struct {
		e   *entry
		err error
	}
	ch := make(chan result, 1)
	gaveUp, taken, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	if !d.spawn(func() {
		defer close(finished)
		e, err := d.create(parent, hash, data, maxTransient, gaveUp)
		ch <- result{e, err}
		select {
		case <-taken:
		case <-gaveUp:
			if e != nil {
				d.abandonAsync(e) // the caller left: take back what we made
			}
		}
	}) {
		return nil, backend.ErrClosed
	}
	select {
	case r := <-ch:
		close(taken)
		return r.e, r.err
	case <-ctx.Done():
		close(gaveUp)
		// Usually one round trip: wait, so that nothing is left behind
		// when we return, but not for a dead connection's timeout (the
		// node, if any, is deleted in the background).
		t := time.NewTimer(d.quickWait())
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
		}
		return nil, context.Cause(ctx)
	}
}

// create makes the queue node under parent, creating parent (a container
// node, which the server deletes once it is empty) when missing. The node
// and the parent's data are written in one transaction, whose zxid, the
// parent's new Mzxid, is the node's Czxid: the fence, without another round
// trip. When a response is lost, the node is looked for by its token hash.
// On an error, it leaves no node behind (cleaning up in the background when
// it cannot tell whether the server made one).
func (d *Driver) create(parent, hash string, data []byte, maxTransient int, stop <-chan struct{}) (*entry, error) {
	prefix := parent + "/" + nodePrefix + hash + "-"
	retry := newBackoff()
	uncertain := false
	fails, noNode := 0, 0
	giveUp := func(err error) (*entry, error) {
		if uncertain {
			d.spawn(func() { d.reapHash(parent, hash, 0) })
		}
		return nil, err
	}
	// A name this driver has not seen: make its node first (with our ACL,
	// so no check is needed), then the queue node. A failure here is met
	// again, and handled, by the create below.
	known := d.knownParent(parent)
	made := !known && d.makeParent(parent)
	for {
		sid := d.conn.SessionID()
		res, err := request(d, func() ([]zk.MultiResponse, error) {
			return d.conn.Multi(
				&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
				&zk.SetDataRequest{Path: parent, Data: []byte{}, Version: -1},
			)
		})
		if err == nil && (len(res) != 2 || res[1].Stat == nil || !strings.HasPrefix(res[0].String, parent+"/")) {
			err = fmt.Errorf("unexpected multi response %+v", res)
			uncertain = true
			return giveUp(err)
		}
		if err == nil {
			name := res[0].String[len(parent)+1:]
			_, seq, ok := parseNode(name)
			// The parent's stat is read in the same transaction, after the
			// create: a single child is ours, so it is first, with no
			// listing of the queue.
			st := res[1].Stat
			e := &entry{parent: parent, name: name, seq: seq, fence: uint64(st.Mzxid), session: sid, first: st.NumChildren == 1}
			if !ok {
				d.deleteQuiet(e.path())
				return nil, fmt.Errorf("unexpected node name %q", name)
			}
			if sid != 0 && d.conn.SessionID() == sid {
				// The name's node was there before us: it must carry our
				// ACL (see acl.go).
				var err error
				if !known && !made {
					err = d.checkACLOn(parent, sid, retry, stop)
				}
				switch {
				case err == nil:
					d.rememberParent(parent)
					return e, nil
				case d.conn.SessionID() != sid || errors.Is(err, zk.ErrSessionExpired):
					// The session ended during the check: as below.
				default:
					d.deleteQuiet(e.path())
					switch {
					case errors.Is(err, backend.ErrPermission):
						return nil, err
					case d.isClosed():
						return giveUp(backend.ErrClosed)
					}
					return giveUp(err)
				}
			}
			// The session changed under us: the node may be gone or belong
			// to the new session. Start over.
			d.deleteQuiet(e.path())
			err = zk.ErrSessionExpired
		}
		switch {
		case errors.Is(err, zk.ErrNoNode):
			d.forgetParent(parent)
			if noNode++; noNode > 3 {
				return giveUp(fmt.Errorf("create %s: %w", parent, err))
			}
			if err := d.ensureParent(parent); err != nil {
				return giveUp(err)
			}
			continue
		case connLost(err):
			// The server may have made the node before the connection
			// dropped: look for it by its hash.
			uncertain = true
			if e, ferr := d.find(parent, hash); ferr == nil && e != nil {
				d.log.Debug("zklock: found the node of a lost create response", "path", e.path())
				return e, nil
			}
		case transient(err):
		case errors.Is(err, zk.ErrClosing):
			return giveUp(backend.ErrClosed)
		default:
			return giveUp(fmt.Errorf("create the queue node under %s: %w", parent, err))
		}
		if fails++; maxTransient > 0 && fails >= maxTransient {
			return giveUp(fmt.Errorf("create the queue node: %w", err))
		}
		if !retry.sleep(stop, d.done) {
			if d.isClosed() {
				return giveUp(backend.ErrClosed)
			}
			return giveUp(fmt.Errorf("create the queue node: gave up: %w", err))
		}
	}
}

// checkACLOn is checkACL, asked again while its answer is lost on session
// sid: a lost answer says nothing about the ACL, and the queue node made on
// that session stays ours as long as the session lives.
func (d *Driver) checkACLOn(path string, sid int64, b *backoff, stop <-chan struct{}) error {
	for {
		err := d.checkACL(path)
		if err == nil || !connLost(err) || d.conn.SessionID() != sid || !b.sleep(stop, d.done) {
			return err
		}
	}
}

// makeParent creates the node of a name, which may be missing, as a
// container node with the driver's ACL (and the root when it is missing);
// true if this call made it.
func (d *Driver) makeParent(parent string) bool {
	for range 2 {
		_, err := request(d, func() (string, error) {
			return d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		})
		if !errors.Is(err, zk.ErrNoNode) {
			return err == nil
		}
		if d.ensureRoot() != nil {
			return false
		}
	}
	return false
}

// maxParents bounds the driver's memory of names whose node exists.
const maxParents = 8192

func (d *Driver) knownParent(parent string) bool {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	_, ok := d.parents[parent]
	return ok
}

func (d *Driver) rememberParent(parent string) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if len(d.parents) >= maxParents {
		clear(d.parents)
	}
	d.parents[parent] = struct{}{}
}

func (d *Driver) forgetParent(parent string) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	delete(d.parents, parent)
}

// ensureParent creates the container node parent, and the root if needed.
func (d *Driver) ensureParent(parent string) error {
	for range 2 {
		_, err := d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		switch {
		case err == nil, errors.Is(err, zk.ErrNodeExists):
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if err := d.ensureRoot(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("create %s: %w", parent, err)
		}
	}
	return fmt.Errorf("create %s: %w", parent, zk.ErrNoNode)
}

// ensureRoot creates the root and its ancestors, as persistent nodes.
func (d *Driver) ensureRoot() error {
	parts := strings.Split(d.root[1:], "/")
	p := ""
	for _, part := range parts {
		p += "/" + part
		_, err := d.conn.Create(p, []byte{}, 0, d.acl)
		switch {
		case errors.Is(err, zk.ErrNoAuth):
			return fmt.Errorf("%w: cannot create %s (for the root %s): the ACL of its parent does not give this client's identity the CREATE permission (create the root with the driver's ACL)", backend.ErrPermission, p, d.root)
		case err != nil && !errors.Is(err, zk.ErrNodeExists):
			return fmt.Errorf("create the root %s: %w", p, err)
		}
	}
	return nil
}

// find looks for the node of a token hash under parent, after a create
// whose response was lost. Extra nodes of the same hash (a retried create
// that the server made twice) are deleted.
func (d *Driver) find(parent, hash string) (*entry, error) {
	_, _ = d.conn.Sync(parent) // catch up with the leader, which made the node if anyone did
	names, _, err := d.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var best *entry
	for _, n := range names {
		h, seq, ok := parseNode(n)
		if !ok || h != hash {
			continue
		}
		e := &entry{parent: parent, name: n, seq: seq}
		if best == nil || seq < best.seq {
			if best != nil {
				d.deleteQuiet(best.path())
			}
			best = e
		} else {
			d.deleteQuiet(e.path())
		}
	}
	if best == nil {
		return nil, nil
	}
	ok, st, err := d.conn.Exists(best.path())
	if err != nil {
		return nil, err
	}
	if !ok || st.EphemeralOwner != d.conn.SessionID() {
		return nil, nil // gone, or an expired session's, about to go
	}
	best.fence, best.session = uint64(st.Czxid), st.EphemeralOwner
	return best, nil
}

func (d *Driver) deleteQuiet(path string) {
	if err := d.conn.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		d.log.Debug("zklock: delete failed", "path", path, "err", err)
	}
}

// abandon deletes a queue node we no longer want, for a call that is
// about to return: it waits for the delete's answer, but once ctx is done
// only for quickWait (100 ms and a round trip), so that a caller who gave
// up is not held by a dead connection. The delete goes on in the
// background (see abandonAsync).
func (d *Driver) abandon(ctx context.Context, e *entry) {
	done := d.abandonAsync(e)
	t := time.NewTimer(d.ttl)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
		return
	case <-d.done:
		return
	case <-ctx.Done():
	}
	t.Reset(d.quickWait())
	select {
	case <-done:
	case <-t.C:
	}
}

// abandonAsync deletes a queue node in the background; when that fails for
// want of a connection, it retries for as long as the node's session may
// live. The channel is closed once it is done.
func (d *Driver) abandonAsync(e *entry) <-chan struct{} {
	done := make(chan struct{})
	if !d.spawn(func() {
		defer close(done)
		_, err := request(d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(e.path(), -1) })
		if err == nil || errors.Is(err, zk.ErrNoNode) || d.conn.SessionID() != e.session {
			return
		}
		d.reapHash(e.parent, hashOf(e.name), e.session)
	}) {
		close(done)
	}
	return done
}

func hashOf(name string) string {
	h, _, _ := parseNode(name)
	return h
}

// reapHash deletes every node of a token hash under parent, retrying until
// none is left, the driver closes or the session that may own them (if
// known) is gone: then they are gone too.
func (d *Driver) reapHash(parent, hash string, session int64) {
	retry := newBackoff()
	deadline := time.Now().Add(2*d.ttl + 10*time.Second)
	for time.Now().Before(deadline) {
		if session != 0 && d.conn.SessionID() != session {
			return
		}
		names, _, err := d.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return
		}
		if err == nil {
			left := false
			for _, n := range names {
				if h, _, ok := parseNode(n); ok && h == hash {
					if err := d.conn.Delete(parent+"/"+n, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
						left = true
					}
				}
			}
			if !left {
				return
			}
		}
		if !retry.sleep(d.done, nil) {
			return
		}
	}
	d.log.Warn("zklock: could not delete an abandoned queue node; it goes with the session", "parent", parent)
}

// lookup finds the node of l.Token by listing l.Key's queue: its path and
// whether it is first.
func (d *Driver) lookup(ctx context.Context, l backend.Claim) (path string, first bool, err error) {
	parent := d.parentPath(l.Key)
	names, err := d.children(ctx, parent)
	if errors.Is(err, zk.ErrNoNode) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	hash := tokenHash(l.Token)
	mine, minSeq, mySeq := "", int64(-1), int64(-1)
	for _, n := range names {
		h, seq, ok := parseNode(n)
		if !ok {
			continue
		}
		if minSeq < 0 || seq < minSeq {
			minSeq = seq
		}
		if h == hash && (mine == "" || seq < mySeq) {
			mine, mySeq = n, seq
		}
	}
	if mine == "" {
		return "", false, nil
	}
	return parent + "/" + mine, mySeq == minSeq, nil
}

// Release deletes l.Token's node if it holds l.Key.
func (d *Driver) Release(ctx context.Context, l backend.Claim) (err error) {
	defer func() { err = permitted(err) }()
	if d.isClosed() {
		return d.closedErr("release")
	}
	d.mu.Lock()
	h := d.holds[l.Token]
	delete(d.holds, l.Token)
	d.mu.Unlock()
	var path string
	var session int64
	if h != nil {
		path, session = h.path, h.session
		if d.conn.SessionID() != session {
			// Its session ended, and the server deleted the node with it.
			return fmt.Errorf("zklock: release: %w: session %#x expired", backend.ErrNotHeld, session)
		}
	} else {
		p, first, err := d.lookup(ctx, l)
		if err != nil {
			return fmt.Errorf("zklock: release: %w", err)
		}
		if p == "" {
			return fmt.Errorf("zklock: release: %w", backend.ErrNotHeld)
		}
		if !first {
			// A queue node of this token that does not hold the lock: not
			// ours to report as released, but nobody wants it either.
			d.deleteQuiet(p)
			return fmt.Errorf("zklock: release: %w", backend.ErrNotHeld)
		}
		path = p
	}
	// The node's name is unique to the token: after an attempt whose answer
	// was lost, "no node" means that attempt deleted it.
	uncertain := false
	retry := newBackoff()
	for {
		_, err := call(ctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(path, -1) })
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode) && uncertain:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			return fmt.Errorf("zklock: release: %w", backend.ErrNotHeld)
		case session != 0 && d.conn.SessionID() != session:
			return fmt.Errorf("zklock: release: %w: session %#x expired", backend.ErrNotHeld, session)
		case transient(err) && ctx.Err() == nil:
			uncertain = true
			if retry.sleep(ctx.Done(), d.done) {
				continue
			}
		}
		if !transient(err) && ctx.Err() == nil {
			return fmt.Errorf("zklock: release: %w", err)
		}
		// Could not tell. The node lives as long as our session: keep
		// trying, or the lock would stay held.
		i := strings.LastIndexByte(path, '/')
		parent, name := path[:i], path[i+1:]
		d.spawn(func() { d.reapHash(parent, hashOf(name), session) })
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("zklock: release: %w (deleting the node in the background)", err)
	}
}

// Refresh checks that l.Token still holds l.Key: the session keeps the lock
// alive, so there is nothing to extend.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) (err error) {
	defer func() { err = permitted(err) }()
	if d.isClosed() {
		return d.closedErr("refresh")
	}
	d.mu.Lock()
	h := d.holds[l.Token]
	var path string
	var session int64
	if h != nil {
		path, session = h.path, h.session
	}
	d.mu.Unlock()
	if h != nil && d.conn.SessionID() != session {
		return fmt.Errorf("zklock: refresh: %w: session %#x expired", backend.ErrNotHeld, session)
	}
	if h == nil {
		p, first, err := d.lookup(ctx, l)
		if err != nil {
			return fmt.Errorf("zklock: refresh: %w", err)
		}
		if p == "" || !first {
			return fmt.Errorf("zklock: refresh: %w", backend.ErrNotHeld)
		}
		path = p
	}
	type stat struct {
		ok bool
		st *zk.Stat
	}
	r, err := call(ctx, d, func() (stat, error) {
		ok, st, err := d.conn.Exists(path)
		return stat{ok, st}, err
	})
	switch {
	case err != nil && h != nil && d.conn.SessionID() != session:
		return fmt.Errorf("zklock: refresh: %w: session %#x expired", backend.ErrNotHeld, session)
	case err != nil:
		return fmt.Errorf("zklock: refresh: %w", err)
	case !r.ok:
		return fmt.Errorf("zklock: refresh: %w", backend.ErrNotHeld)
	case h != nil && r.st.EphemeralOwner != session:
		return fmt.Errorf("zklock: refresh: %w: the node belongs to another session", backend.ErrNotHeld)
	case l.Fence != 0 && uint64(r.st.Czxid) != l.Fence:
		return fmt.Errorf("zklock: refresh: %w: another incarnation", backend.ErrNotHeld)
	}
	return nil
}

// backoff spaces retries: 20ms doubling to 500ms.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 20 * time.Millisecond} }

// sleep waits for the next retry; false if a or b closed first.
func (b *backoff) sleep(a, c <-chan struct{}) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	b.d = min(2*b.d, 500*time.Millisecond)
	select {
	case <-t.C:
		return true
	case <-a:
		return false
	case <-c:
		return false
	}
}
