package zklock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// enqueue creates l's queue node: its ticket, not looked at yet. An error
// comes with a ticket when the node may exist (the answer was lost, or the
// caller left): its look finds it, its Leave deletes it. waits: see join.
func (d *Driver) enqueue(ctx context.Context, l backend.Claim, waits bool) (*ticket, error) {
	parent, head := d.queueOf(l)
	hash, data := tokenHash(l.Token), []byte(l.Owner)
	es, err := creating(ctx, d, func(ctx context.Context, inline bool) ([]*entry, error) {
		e, err := d.create(ctx, parent, head, hash, data, l, waits, inline)
		if e == nil {
			return nil, err
		}
		return []*entry{e}, err
	})
	if es == nil {
		return nil, err
	}
	return &ticket{d: d, l: l, e: es[0], waits: waits}, err
}

// creating runs mk, which makes queue nodes and returns them, on the
// caller's goroutine (inline) when the driver can cut its reads, else on
// its own, which deletes what mk made if the caller left meanwhile: a
// request the caller stopped waiting for leaves nothing behind.
func creating(ctx context.Context, d *Driver, mk func(ctx context.Context, inline bool) ([]*entry, error)) ([]*entry, error) {
	if d.inline() {
		w := d.dialed.conns.CutOnEnd(ctx)
		es, err := mk(ctx, true)
		w.Stop()
		return es, d.failed(ctx, err)
	}
	type result struct {
		es  []*entry
		err error
	}
	ch := make(chan result, 1)
	taken, finished := make(chan struct{}), make(chan struct{})
	// mk runs until it is done or the caller leaves (or Close begins).
	cctx, cancel := context.WithCancel(d.gate.Context())
	if !d.spawn(func() {
		defer close(finished)
		defer cancel()
		es, err := mk(cctx, false)
		ch <- result{es, err}
		select {
		case <-taken:
		case <-cctx.Done():
			if es != nil {
				<-d.abandonAsync(es...) // the caller left: take back what we made
			}
		}
	}) {
		cancel()
		return nil, backend.ErrClosed
	}
	select {
	case r := <-ch:
		close(taken)
		return r.es, r.err
	case <-ctx.Done():
		cancel()
		// Usually a round trip: wait, but not for a dead connection (the
		// nodes, if any, are then deleted in the background).
		within(finished, d.quickWait())
		return nil, d.ended(ctx)
	}
}

// queueOf is the node of l's queue, and the head of its nodes' names.
func (d *Driver) queueOf(l backend.Claim) (parent, head string) {
	if l.Mode != backend.Exclusive {
		return d.sharedParent(l), sharedHead(l)
	}
	return d.parentPath(l.Key), nodePrefix
}

// create makes the queue node parent/head+hash+"-"+sequence with a write
// of the parent in the same transaction, whose zxid is the fence (see
// docs/backends/zklock.md, The recipe), and l's delay marker if any. On
// "no node" it makes the name's node and tries again. An answer lost gives
// the entry with its name unknown, to be found by its hash. waits or
// inline: it sends only once the session settled (see resumeDelay).
func (d *Driver) create(ctx context.Context, parent, head, hash string, data []byte, l backend.Claim, waits, inline bool) (*entry, error) {
	prefix := parent + "/" + head + hash + "-"
	marked := d.marks(l)
	reuse := false // l's token left a marker with an earlier session
	// A name's node this driver made, or has checked, carries our ACL.
	checked := d.knownParent(parent)
	// A name not known to exist is made in the request that makes its
	// first node (see createFresh).
	fresh := !checked
	needParent := false
	for noNode := 0; ; {
		sid := d.conn.SessionID()
		if (waits || inline) && !d.settled(ctx) {
			return nil, fmt.Errorf("create the queue node: %w", errNoSession)
		}
		if needParent {
			made, err := d.ensureParent(parent)
			if err != nil {
				return nil, err
			}
			needParent, checked = false, made
		}
		var c created
		var err error
		if waits {
			d.tries.Add(1) // a waiting acquisition's try (storeTries)
		}
		if fresh {
			c, err = d.createFresh(parent, prefix, data, d.markerOps(parent, hash, l, false))
			switch {
			case err == nil:
				checked = true // ours, with our ACL
			case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrNoAuth):
				// The name's node exists (or we may not write the root):
				// the usual create, which says what is wrong, if anything.
				fresh = false
				continue
			case errors.Is(err, zk.ErrNoNode):
				fresh = false // the root is missing: made below
			}
		} else {
			var res []zk.MultiResponse
			ops := append([]any{&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence}},
				d.markerOps(parent, hash, l, reuse)...)
			ops = append(ops, &zk.SetDataRequest{Path: parent, Data: []byte{}, Version: -1})
			res, err = request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
			last := len(ops) - 1
			switch {
			case err != nil:
			case len(res) != len(ops) || res[last].Stat == nil:
				err = fmt.Errorf("%w %+v", errUnexpected, res)
			default:
				c = created{path: res[0].String, zxid: res[last].Stat.Mzxid, children: res[last].Stat.NumChildren}
			}
		}
		if marked && !fresh {
			switch {
			case errors.Is(err, zk.ErrNodeExists) && !reuse:
				reuse = true // the name's node exists: the marker does
				continue
			case errors.Is(err, zk.ErrNoNode) && reuse:
				reuse = false // gone meanwhile, or the name's node is
			}
		}
		if err == nil && !under(c.path, parent) {
			err = fmt.Errorf("%w: node %q", errUnexpected, c.path)
		}
		switch {
		case connLost(err), errors.Is(err, errUnexpected):
			// The server may have made the node.
			return &entry{parent: parent, hash: hash, session: sid, marked: marked}, fmt.Errorf("create the queue node: %w", err)
		case errors.Is(err, zk.ErrNoNode):
			// The name's node is missing (never made, or deleted once
			// empty): make it, a bounded number of times.
			d.forgetParent(parent)
			if noNode++; noNode > 3 {
				return nil, fmt.Errorf("create %s: %w", parent, err)
			}
			needParent = true
			continue
		case errors.Is(err, zk.ErrClosing):
			return nil, backend.ErrClosed
		case err != nil:
			return nil, fmt.Errorf("create the queue node under %s: %w", parent, err)
		}
		name := c.path[len(parent)+1:]
		_, _, seq, ok := parseTagged(name)
		// The parent's stat, read after the create: a single child (with
		// our marker, two) is ours, first with no listing.
		ours := int32(1)
		if marked {
			ours++
		}
		e := &entry{parent: parent, name: name, full: c.path, hash: hash, seq: seq, fence: uint64(c.zxid), session: sid, first: c.children == ours, marked: marked}
		switch {
		case !ok:
			err = fmt.Errorf("unexpected node name %q", name)
		case sid == 0 || d.conn.SessionID() != sid:
			// The session changed: the node may be gone or the new one's.
			err = fmt.Errorf("create the queue node: %w", zk.ErrSessionExpired)
		case !checked:
			// The name's node was there before us: it must carry our ACL.
			err = d.checkACL(parent)
		}
		if err != nil {
			d.abandon(ctx, e)
			return nil, err
		}
		d.rememberParent(parent)
		return e, nil
	}
}

// firstSeq is the sequence number of the first child of a node.
const firstSeq = "0000000000"

// createFresh makes a name's node, a container, and the queue node (and
// marker ops) under it in one multi-op. The zk client cannot read a
// container's create in a reply (ErrAPIError with the results before it),
// so a leading write to the root carries the zxid, and the node's name is
// known without its result: a new node's first child is firstSeq.
func (d *Driver) createFresh(parent, prefix string, data []byte, marker []any) (created, error) {
	ops := append([]any{
		&zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1},
		&zk.CreateRequest{Path: parent, Data: []byte{}, Acl: d.acl, Flags: zk.FlagContainer},
		&zk.CreateRequest{Path: prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
	}, marker...)
	return request(d, func() (created, error) {
		res, err := d.conn.Multi(ops...)
		var path string
		switch {
		case err == nil && len(res) == len(ops) && res[0].Stat != nil:
			path = res[2].String // a zk client that reads the whole reply
		case errors.Is(err, zk.ErrAPIError) && len(res) == 1 && res[0].Stat != nil && res[0].Error == nil:
			path = prefix + firstSeq
		case err != nil:
			return created{}, err
		default:
			return created{}, fmt.Errorf("%w %+v", errUnexpected, res)
		}
		return created{path: path, zxid: res[0].Stat.Mzxid, children: int32(1 + len(marker))}, nil
	})
}

// created is what a create's multi-op says: the queue node's path, the
// zxid (the fence) and the number of the name's node's children after it.
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

// find looks for the node of a token hash under parent after a create's
// lost answer, and deletes extra ones (a create the server made twice).
func (d *Driver) find(parent, head, hash string) (*entry, error) {
	_, _ = d.conn.Sync(parent) // catch up with the leader, which made the node if anyone did
	names, _, err := d.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	mine := tokenNodes(names, head, hash)
	if len(mine) == 0 {
		return nil, nil
	}
	for _, n := range mine[1:] {
		d.deleteQuiet(parent + "/" + n.name)
	}
	best := &entry{parent: parent, name: mine[0].name, seq: mine[0].seq}
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

func (d *Driver) parentPath(key string) string { return d.root + "/" + backend.EscapeKey(key) }

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

// ensureParent creates the container node parent, and the root if
// needed; made is false when it existed (its ACL must be checked).
func (d *Driver) ensureParent(parent string) (made bool, err error) {
	for range 2 {
		_, err := request(d, func() (string, error) {
			return d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, zk.ErrNodeExists):
			return false, nil
		case errors.Is(err, zk.ErrNoNode):
			if err := d.ensureRoot(); err != nil {
				return false, err
			}
		default:
			return false, fmt.Errorf("create %s: %w", parent, err)
		}
	}
	return false, fmt.Errorf("create %s: %w", parent, zk.ErrNoNode)
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
