package zklock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

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
