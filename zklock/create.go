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

// enqueue creates l's queue node, riding out store failures as t allows.
// On an error it leaves no node behind.
func (d *Driver) enqueue(ctx context.Context, l backend.Claim, t *tries) (*entry, error) {
	parent, head := d.parentPath(l.Key), nodePrefix
	if l.Mode != backend.Exclusive {
		parent, head = d.sharedParent(l), sharedHead(l)
	}
	hash := tokenHash(l.Token)
	data := []byte(l.Owner)
	if d.inline() {
		in := d.interruptOnEnd(ctx)
		e, err := d.create(ctx, parent, head, hash, data, t, true)
		in.stop()
		if ctx.Err() != nil {
			// The caller left: take back what we made, briefly (as below).
			if e != nil {
				d.abandonQuick(e)
			}
			return nil, d.ended(ctx)
		}
		return e, err
	}
	type result struct {
		e   *entry
		err error
	}
	ch := make(chan result, 1)
	taken, finished := make(chan struct{}), make(chan struct{})
	// create runs until it is done or the caller leaves (or Close begins).
	cctx, cancel := context.WithCancel(d.gate.Context())
	if !d.spawn(func() {
		defer close(finished)
		defer cancel()
		e, err := d.create(cctx, parent, head, hash, data, t, false)
		ch <- result{e, err}
		select {
		case <-taken:
		case <-cctx.Done():
			if e != nil {
				d.abandonAsync(e) // the caller left: take back what we made
			}
		}
	}) {
		cancel()
		return nil, backend.ErrClosed
	}
	select {
	case r := <-ch:
		close(taken)
		return r.e, r.err
	case <-ctx.Done():
		cancel()
		// Usually one round trip: wait, so that nothing is left behind
		// when we return, but not for a dead connection's timeout (the
		// node, if any, is deleted in the background).
		t := time.NewTimer(d.quickWait())
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
		}
		return nil, d.ended(ctx)
	}
}

// create makes the queue node under parent, named head+hash+"-"+sequence. It tries the create first, as
// the name's node usually exists; on "no node" it creates the name's node
// (a container node, which the server deletes once it is empty) and tries
// again. The node and the parent's data are written in one transaction,
// whose zxid, the parent's new Mzxid, is the node's Czxid: the fence, from
// the ensemble's one counter, without another round trip. When a response
// is lost, the node is looked for by its token hash. On an error, it
// leaves no node behind (cleaning up in the background when it cannot
// tell whether the server made one). inline: it runs on the caller's
// goroutine (see interrupt.go), and sends only while the zk client has a
// session, since a request queued for the next connection cannot be cut.
func (d *Driver) create(ctx context.Context, parent, head, hash string, data []byte, t *tries, inline bool) (*entry, error) {
	prefix := parent + "/" + head + hash + "-"
	bo := newBackoff()
	uncertain := false
	noNode := 0
	giveUp := func(err error) (*entry, error) {
		if uncertain {
			d.spawn(func() { d.reapHash(parent, hash, 0) })
		}
		return nil, err
	}
	// A name's node this driver made, or has checked, carries our ACL.
	checked := d.knownParent(parent)
	// A name not known to exist is made in the request that makes its
	// first node (see createFresh).
	fresh := !checked
	needParent := false
	lookFirst := false // a create's answer was lost: look for its node before another
	for {
		sid, sent := d.conn.SessionID(), time.Now()
		if (t.budget > 0 || inline) && !d.settled(ctx) {
			// Acquire: a try not sent for want of a session fails.
			switch {
			case t.fail(sent):
				return giveUp(fmt.Errorf("create the queue node: %w", errNoSession))
			case !pause(ctx, bo):
				return giveUp(d.ended(ctx))
			}
			continue
		}
		if lookFirst {
			e, err := d.find(parent, head, hash)
			switch {
			case err == nil && e != nil:
				d.log.Debug("zklock: found the node of a lost create response", "path", e.path())
				return e, nil
			case err == nil:
				lookFirst = false // none: create it
			case t.fail(sent):
				return giveUp(fmt.Errorf("look for the queue node: %w", err))
			case !pause(ctx, bo):
				return giveUp(d.ended(ctx))
			}
			if lookFirst {
				continue
			}
		}
		if needParent {
			made, err := d.ensureParent(parent)
			switch {
			case err == nil:
				t.ok()
				needParent, checked = false, made
			case !transient(err):
				return giveUp(err)
			case t.fail(sent):
				return giveUp(fmt.Errorf("create the queue node: %w", err))
			case !pause(ctx, bo):
				return giveUp(d.ended(ctx))
			}
			if needParent {
				continue
			}
		}
		var c created
		var err error
		if t.budget > 0 {
			d.tries.Add(1) // a waiting acquisition's try (storeTries)
		}
		if fresh {
			c, err = d.createFresh(parent, prefix, data)
			switch {
			case err == nil:
				checked = true // ours, with our ACL
			case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrNoAuth):
				// The name's node exists (or we may not write the root):
				// the usual create, which says what is wrong, if anything.
				t.ok()
				fresh = false
				continue
			case errors.Is(err, zk.ErrNoNode):
				fresh = false // the root is missing: made below
			}
		} else {
			var res []zk.MultiResponse
			res, err = request(d, func() ([]zk.MultiResponse, error) {
				return d.conn.Multi(
					&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
					&zk.SetDataRequest{Path: parent, Data: []byte{}, Version: -1},
				)
			})
			switch {
			case err != nil:
			case len(res) != 2 || res[1].Stat == nil:
				err = fmt.Errorf("%w %+v", errUnexpected, res)
			default:
				c = created{path: res[0].String, zxid: res[1].Stat.Mzxid, children: res[1].Stat.NumChildren}
			}
		}
		if err == nil && !under(c.path, parent) {
			err = fmt.Errorf("%w: node %q", errUnexpected, c.path)
		}
		if errors.Is(err, errUnexpected) {
			uncertain = true
			return giveUp(err)
		}
		if err == nil {
			name := c.path[len(parent)+1:]
			_, _, seq, ok := parseTagged(name)
			// The parent's stat is read in the same transaction, after the
			// create: a single child is ours, so it is first, with no
			// listing of the queue.
			e := &entry{parent: parent, name: name, full: c.path, seq: seq, fence: uint64(c.zxid), session: sid, first: c.children == 1}
			if !ok {
				d.deleteQuiet(e.path())
				return nil, fmt.Errorf("unexpected node name %q", name)
			}
			if sid != 0 && d.conn.SessionID() == sid {
				t.ok()
				// The name's node was there before us: it must carry our
				// ACL (see acl.go).
				var err error
				if !checked {
					err = d.checkACLOn(ctx, parent, sid, bo)
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
			// The name's node is missing (never made, or deleted by the
			// server once empty, maybe between our tries): make it. A
			// bounded number of times, as each one is an answer.
			t.ok()
			d.forgetParent(parent)
			if noNode++; noNode > 3 {
				return giveUp(fmt.Errorf("create %s: %w", parent, err))
			}
			needParent = true
			continue
		case connLost(err):
			// The server may have made the node before the connection
			// dropped: look for it by its hash before another try (unless
			// the caller left: then giveUp deletes it, if any, in the
			// background).
			uncertain = true
			if ctx.Err() != nil {
				return giveUp(d.ended(ctx))
			}
			if !inline {
				if e, ferr := d.find(parent, head, hash); ferr == nil && e != nil {
					d.log.Debug("zklock: found the node of a lost create response", "path", e.path())
					return e, nil
				}
			} else {
				lookFirst = true // once the zk client has a session again
			}
		case transient(err):
		case errors.Is(err, zk.ErrClosing):
			return giveUp(backend.ErrClosed)
		default:
			return giveUp(fmt.Errorf("create the queue node under %s: %w", parent, err))
		}
		if t.fail(sent) {
			return giveUp(fmt.Errorf("create the queue node: %w", err))
		}
		if !pause(ctx, bo) {
			return giveUp(d.ended(ctx))
		}
	}
}

// firstSeq is the sequence number of the first child of a node.
const firstSeq = "0000000000"

// createFresh makes a name's node, a container, and the queue node under
// it in one multi-op, and answers as the usual create's multi-op does: the
// node's path, the fence and one child (the name's node is new: no node is
// ahead of ours). The multi-op begins with
// a write to the root, whose stat in the reply carries the transaction's
// zxid (the node's creation zxid, the fence): the zk client cannot read a
// container's create in a multi-op's reply, and returns ErrAPIError with
// the results before it. The server only answers a failed multi-op with
// errors, so that means success; the node's name is then known without
// its result, the first child of a new node being numbered firstSeq.
func (d *Driver) createFresh(parent, prefix string, data []byte) (created, error) {
	return request(d, func() (created, error) {
		res, err := d.conn.Multi(
			&zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1},
			&zk.CreateRequest{Path: parent, Data: []byte{}, Acl: d.acl, Flags: zk.FlagContainer},
			&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
		)
		var path string
		switch {
		case err == nil && len(res) == 3 && res[0].Stat != nil:
			path = res[2].String // a zk client that reads the whole reply
		case errors.Is(err, zk.ErrAPIError) && len(res) == 1 && res[0].Stat != nil && res[0].Error == nil:
			path = prefix + firstSeq
		case err != nil:
			return created{}, err
		default:
			return created{}, fmt.Errorf("%w %+v", errUnexpected, res)
		}
		return created{path: path, zxid: res[0].Stat.Mzxid, children: 1}, nil
	})
}

// created is what a create's multi-op says: the queue node's path, the
// transaction's zxid (the fence) and the number of children of the name's
// node after it.
type created struct {
	path     string
	zxid     int64
	children int32
}

// errUnexpected: a multi-op's reply that the driver cannot read.
var errUnexpected = errors.New("unexpected multi response")

// under reports whether path is a child of parent.
func under(path, parent string) bool {
	return len(path) > len(parent)+1 && path[len(parent)] == '/' && path[:len(parent)] == parent
}

// checkACLOn is checkACL, asked again while its answer is lost on session
// sid: a lost answer says nothing about the ACL, and the queue node made on
// that session stays ours as long as the session lives.
func (d *Driver) checkACLOn(ctx context.Context, path string, sid int64, bo *retry.Backoff) error {
	for {
		err := d.checkACL(path)
		if err == nil || !connLost(err) || d.conn.SessionID() != sid || !pause(ctx, bo) {
			return err
		}
		// Asked again once the zk client has a session: not queued
		// for a connection that an inline call cannot cut.
		for !d.settled(ctx) {
			if !pause(ctx, bo) {
				return err
			}
		}
	}
}

// find looks for the node of a token hash under parent, after a create
// whose response was lost. Extra nodes of the same hash (a retried create
// that the server made twice) are deleted.
func (d *Driver) find(parent, head, hash string) (*entry, error) {
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
		tag, h, seq, ok := parseTagged(n)
		if !ok || h != hash || tag+"-" != head {
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
