package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
)

// creating runs mk, which makes queue nodes and returns them, on the
// caller's goroutine (inline) when the driver can cut its reads, else on
// its own, which deletes what mk made if the caller left meanwhile: a
// request the caller stopped waiting for leaves nothing behind.
func creating(ctx context.Context, d *Driver, mk func(ctx context.Context, inline bool) ([]*entry, error)) ([]*entry, error) {
	if d.inline() {
		w := d.dialed.conns.CutOnEnd(ctx)
		es, err := mk(ctx, true)
		w.Stop()
		return es, d.gate.Failed(ctx, err)
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
		parallel.Within(finished, d.quickWait())
		return nil, d.gate.Failed(ctx, ctx.Err())
	}
}

// create makes the claims' queue nodes, parent/head+hash+"-"+sequence, in
// one multi-op whose zxid is every fence (see docs/backends/zklock.md, The
// recipe): a write of the root first when a name's node is made; then for
// each name known to exist its queue node, delay marker if any, and a
// write of the name's node, whose stat counts its children; last each new
// name's node (a container), queue node and marker. The zk client cannot
// read a container's create in a reply (ErrAPIError with the results
// before it): a new node's first child is firstSeq. A refused multi-op
// changed nothing: what it names is made, taken as existing or reset, and
// it goes again. An answer lost gives entries with their names unknown, to
// be found by their hashes. waits or inline: it sends only once the
// session settled (see resumeDelay).
func (d *Driver) create(ctx context.Context, claims []backend.Claim, waits, inline bool) ([]*entry, error) {
	type node struct {
		parent, prefix, hash string
		marked               bool
		checked              bool // its name's node carries our ACL (made or checked by us)
		fresh                bool // its name's node is made by the multi-op
		reuse                bool // its marker, left by an earlier session's node of its token, is reset
		denied               bool // the multi-op may not make its name's node: made on its own
		at, stat             int  // its create's op, its name's node's write (-1: none)
	}
	n := len(claims)
	ns := make([]node, n)
	for i, l := range claims {
		parent, head := d.queueParent(l), queueHead(l)
		q := node{parent: parent, hash: tokenHash(l.Token), marked: d.marks(l), checked: d.knownParent(parent)}
		q.prefix, q.fresh = parent+"/"+head+q.hash+"-", !q.checked
		ns[i] = q
	}
	for answers := 0; ; answers++ {
		sid := d.conn.SessionID()
		if (waits || inline) && !d.settled(ctx) {
			return nil, fmt.Errorf("create the queue node: %w", errNoSession)
		}
		ops := make([]any, 0, 4*n+1)   // the root's write, each claim's at most 4
		owner := make([]int, 0, 4*n+1) // each op's claim, -1 for the root's write
		add := func(i int, op any) { owner = append(owner, i); ops = append(ops, op) }
		anyFresh := slices.ContainsFunc(ns, func(q node) bool { return q.fresh })
		if anyFresh {
			add(-1, &zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1})
		}
		readable := -1 // ops whose results the zk client reads: those before the first container
		for _, last := range []bool{false, true} {
			for i, l := range claims {
				q := &ns[i]
				if q.fresh != last {
					continue
				}
				if last {
					if readable < 0 {
						readable = len(ops)
					}
					add(i, &zk.CreateRequest{Path: q.parent, Data: []byte{}, Acl: d.acl, Flags: zk.FlagContainer})
				}
				q.at, q.stat = len(ops), -1
				add(i, &zk.CreateRequest{Path: q.prefix, Data: []byte(l.Owner), Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence})
				for _, op := range d.markerOps(q.parent, q.hash, l, q.reuse) {
					add(i, op)
				}
				if !last {
					q.stat = len(ops)
					add(i, &zk.SetDataRequest{Path: q.parent, Data: []byte{}, Version: -1})
				}
			}
		}
		if readable < 0 {
			readable = len(ops)
		}
		zxidAt := 0 // a write whose stat carries the zxid
		if !anyFresh {
			zxidAt = ns[0].stat
		}
		if waits {
			d.tries.Add(1) // a waiting acquisition's try (storeTries)
		}
		res, err := request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
		if err == nil || errors.Is(err, zk.ErrAPIError) && readable < len(ops) {
			err = nil
			if len(res) != len(ops) && len(res) != readable || res[zxidAt].Stat == nil {
				err = fmt.Errorf("%w %+v", errUnexpected, res)
			}
			for j, r := range res {
				if err == nil && (r.Error != nil || r.Stat == nil && slices.ContainsFunc(ns, func(q node) bool { return q.stat == j })) {
					err = fmt.Errorf("%w %+v", errUnexpected, res)
				}
			}
		}
		j := refused(res, err)
		i := -1
		if j >= 0 {
			i = owner[j]
		}
		switch {
		case connLost(err), errors.Is(err, errUnexpected):
			// The server may have made the nodes: found by hash.
			es := make([]*entry, n)
			for i, q := range ns {
				es[i] = &entry{parent: q.parent, hash: q.hash, session: sid, marked: q.marked}
			}
			return es, fmt.Errorf("create the queue node: %w", err)
		case errors.Is(err, zk.ErrClosing):
			return nil, backend.ErrClosed
		case err == nil:
		case answers >= 2*n+3:
			return nil, fmt.Errorf("create the queue node: %w", err)
		case errors.Is(err, zk.ErrNoNode) && (i < 0 || ns[i].fresh):
			// The root is missing.
			if err := d.ensureRoot(); err != nil {
				return nil, err
			}
			continue
		case (errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrNoNode)) && i >= 0 && ns[i].at < j && j < ns[i].stat:
			// Its marker: left by an earlier session's node of its token
			// (reset it), or gone meanwhile (make it).
			ns[i].reuse = errors.Is(err, zk.ErrNodeExists)
			continue
		case errors.Is(err, zk.ErrNoNode) && i >= 0:
			// The name's node is gone (deleted by the server once empty).
			q := &ns[i]
			d.forgetParent(q.parent)
			q.fresh, q.checked, q.reuse = !q.denied, false, false
			if q.denied {
				if q.checked, err = d.ensureParent(q.parent); err != nil {
					return nil, err
				}
			}
			continue
		case (errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrNoAuth)) && i >= 0 && ns[i].fresh,
			errors.Is(err, zk.ErrNoAuth) && i < 0 && anyFresh:
			// The name's node exists (or we may not write the root): the
			// usual create, which says what is wrong, if anything.
			for k := range ns {
				if i < 0 || k == i {
					ns[k].fresh, ns[k].denied = false, ns[k].fresh && errors.Is(err, zk.ErrNoAuth)
				}
			}
			continue
		default:
			return nil, fmt.Errorf("create the queue node: %w", err)
		}
		es := make([]*entry, n)
		for i, q := range ns {
			e := &entry{parent: q.parent, hash: q.hash, session: sid, marked: q.marked, first: true}
			var path string
			if q.at < len(res) {
				path = res[q.at].String
			} else {
				path = q.prefix + firstSeq
			}
			if under(path, q.parent) {
				e.name, e.full = path[len(q.parent)+1:], path
			}
			if q.stat >= 0 {
				// The name's node's children after the create: ours
				// alone (with our marker, two) is first, with no listing.
				ours := int32(1)
				if q.marked {
					ours++
				}
				e.first = res[q.stat].Stat.NumChildren == ours
			}
			e.fence = uint64(res[zxidAt].Stat.Mzxid)
			var ok bool
			if _, _, e.seq, ok = parseTagged(e.name); !ok && err == nil {
				err = fmt.Errorf("%w: node %q", errUnexpected, path)
			}
			es[i] = e
		}
		if err == nil && (sid == 0 || d.conn.SessionID() != sid) {
			// The session changed: the nodes may be gone or the new one's.
			err = fmt.Errorf("create the queue node: %w", zk.ErrSessionExpired)
		}
		if err == nil && slices.ContainsFunc(ns, func(q node) bool { return !q.checked && !q.fresh }) {
			// Names' nodes there before us must carry our ACL (no
			// goroutine per name when all are known, as a rule).
			err = errors.Join(parallel.Each(n, n, func(i int) error {
				if ns[i].checked || ns[i].fresh {
					return nil
				}
				return d.checkACL(ns[i].parent)
			})...)
		}
		if err != nil {
			d.abandon(ctx, es...)
			return nil, err
		}
		for _, q := range ns {
			d.rememberParent(q.parent)
		}
		return es, nil
	}
}

// firstSeq is the sequence number of the first child of a node.
const firstSeq = "0000000000"

// refused is the op a refused multi-op's reply names, -1 if none.
func refused(res []zk.MultiResponse, err error) int {
	if err == nil || !answered(err) {
		return -1
	}
	return slices.IndexFunc(res, func(r zk.MultiResponse) bool { return r.Error != nil && errors.Is(err, r.Error) })
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
		if err := d.conn.Delete(parent+"/"+n.name, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			d.log.Debug("zklock: delete failed", "path", parent+"/"+n.name, "err", err)
		}
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
