package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// TryAcquireAll implements backend.SetAcquirer: one multi-op makes every
// claim's queue node (and names' nodes, as createFresh) and reads each
// name's node's stat, as create does; the other queues are listed at once,
// and if a node does not hold, one multi-op deletes them all. Every fence
// is the multi-op's zxid.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) (_ []backend.Grant, err error) {
	defer func() { err = permitted(err) }()
	if len(claims) == 0 {
		return nil, nil
	}
	for _, l := range claims {
		if l.Mode != backend.Exclusive || l.Delay > 0 {
			// A marker makes the children count another's: one at a time.
			return nil, fmt.Errorf("zklock: try-acquire: a set of claims with a lock-delay, or not exclusive: %w", backend.ErrUnsupported)
		}
	}
	ctx, done, err := d.enter(ctx, "try-acquire")
	if err != nil {
		return nil, err
	}
	defer done()
	bo := newBackoff()
	for try := 1; ; try++ {
		es, err := creating(ctx, d, func(ctx context.Context, inline bool) ([]*entry, error) {
			return d.createSet(ctx, claims, inline)
		})
		if es != nil {
			// Nodes that may exist: held, or deleted before we return.
			var gs []backend.Grant
			if err == nil {
				if gs, err = d.holdSet(ctx, claims, es); err == nil {
					return gs, nil
				}
			}
			d.abandon(ctx, es...)
		}
		// As TryAcquire: a failure that left no node is tried again.
		if es != nil || try == 3 || !transient(err) || !pause(ctx, bo) {
			return nil, fmt.Errorf("zklock: try-acquire: %w", d.failed(ctx, err))
		}
	}
}

// createSet is create for a set of claims, in one multi-op: the root's
// write first when a name's node is made (as in createFresh), then each
// known name's queue node and write, then each new name's node and queue
// node (numbered firstSeq). A refused multi-op changed nothing: the name
// it names is made or taken as existing, and it goes again.
func (d *Driver) createSet(ctx context.Context, claims []backend.Claim, inline bool) ([]*entry, error) {
	n := len(claims)
	parents, prefixes := make([]string, n), make([]string, n)
	fresh, checked := make([]bool, n), make([]bool, n)
	for i, l := range claims {
		parents[i] = d.parentPath(l.Key)
		prefixes[i] = parents[i] + "/" + nodePrefix + tokenHash(l.Token) + "-"
		checked[i] = d.knownParent(parents[i])
		fresh[i] = !checked[i]
	}
	for answers := 0; ; answers++ {
		sid := d.conn.SessionID()
		if inline && !d.settled(ctx) {
			return nil, fmt.Errorf("create the queue nodes: %w", errNoSession)
		}
		var ops []any
		at, claimOf := make([]int, n), map[int]int{} // each claim's create; each op's claim
		add := func(i int, op any) { claimOf[len(ops)] = i; ops = append(ops, op) }
		anyFresh := slices.Contains(fresh, true)
		zxidAt := 1 // a write whose stat carries the zxid: the first name's
		if anyFresh {
			zxidAt = 0
			ops = append(ops, &zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1})
		}
		for _, last := range []bool{false, true} {
			for i, l := range claims {
				if fresh[i] != last {
					continue
				}
				if last {
					add(i, &zk.CreateRequest{Path: parents[i], Data: []byte{}, Acl: d.acl, Flags: zk.FlagContainer})
				}
				at[i] = len(ops)
				add(i, &zk.CreateRequest{Path: prefixes[i], Data: []byte(l.Owner), Acl: d.acl, Flags: zk.FlagEphemeral | zk.FlagSequence})
				if !last {
					add(i, &zk.SetDataRequest{Path: parents[i], Data: []byte{}, Version: -1})
				}
			}
		}
		readable := len(ops) // ops whose results the zk client reads
		for i := range fresh {
			if fresh[i] {
				readable = min(readable, at[i]-1)
			}
		}
		res, err := request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
		if err == nil || errors.Is(err, zk.ErrAPIError) && readable < len(ops) {
			err = nil
			if len(res) != len(ops) && len(res) != readable || res[zxidAt].Stat == nil {
				err = fmt.Errorf("%w %+v", errUnexpected, res)
			}
			for j, r := range res {
				if err == nil && (r.Error != nil || !fresh[claimOf[j]] && at[claimOf[j]]+1 == j && r.Stat == nil) {
					err = fmt.Errorf("%w %+v", errUnexpected, res)
				}
			}
		}
		i, failed := d.failedOp(res, err, claimOf)
		switch {
		case connLost(err), errors.Is(err, errUnexpected):
			// The server may have made the nodes: found by hash.
			es := make([]*entry, n)
			for i, l := range claims {
				es[i] = &entry{parent: parents[i], hash: tokenHash(l.Token), session: sid}
			}
			return es, fmt.Errorf("create the queue nodes: %w", err)
		case errors.Is(err, zk.ErrClosing):
			return nil, backend.ErrClosed
		case err == nil:
		case answers >= 2*n+3:
			return nil, fmt.Errorf("create the queue nodes: %w", err)
		case errors.Is(err, zk.ErrNoNode) && (i < 0 || fresh[i]):
			// The root is missing.
			if err := d.ensureRoot(); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, zk.ErrNoNode) && failed:
			// The name's node is gone (deleted by the server once empty).
			d.forgetParent(parents[i])
			fresh[i], checked[i] = true, false
			continue
		case (errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrNoAuth)) && i >= 0 && fresh[i],
			errors.Is(err, zk.ErrNoAuth) && i < 0 && anyFresh:
			// As in create: the usual create says what is wrong, if anything.
			for j := range fresh {
				if i < 0 || j == i {
					fresh[j] = false
				}
			}
			continue
		default:
			return nil, fmt.Errorf("create the queue nodes: %w", err)
		}
		es := make([]*entry, n)
		for i := range claims {
			path, children := prefixes[i]+firstSeq, int32(1)
			if at[i] < len(res) {
				path = res[at[i]].String
			}
			if !fresh[i] {
				children = res[at[i]+1].Stat.NumChildren
			}
			e := &entry{parent: parents[i], hash: tokenHash(claims[i].Token), session: sid}
			if under(path, parents[i]) {
				e.name, e.full = path[len(parents[i])+1:], path
			}
			_, _, seq, ok := parseTagged(e.name)
			if !ok {
				err = fmt.Errorf("%w: node %q", errUnexpected, path)
			}
			e.seq, e.fence, e.first = seq, uint64(res[zxidAt].Stat.Mzxid), children == 1
			es[i] = e
		}
		if err == nil && (sid == 0 || d.conn.SessionID() != sid) {
			// The session changed: the nodes may be gone or the new one's.
			err = fmt.Errorf("create the queue nodes: %w", zk.ErrSessionExpired)
		}
		if err == nil {
			// Names' nodes there before us must carry our ACL.
			err = each(n, n, func(i int) error {
				if checked[i] || fresh[i] {
					return nil
				}
				return d.checkACL(parents[i])
			})
		}
		if err != nil {
			d.abandon(ctx, es...)
			return nil, err
		}
		for _, p := range parents {
			d.rememberParent(p)
		}
		return es, nil
	}
}

// failedOp is the claim whose op a refused multi-op names (-1 when it is
// none's: the root's write); failed is false when the reply names none.
func (d *Driver) failedOp(res []zk.MultiResponse, err error, claimOf map[int]int) (i int, failed bool) {
	if err == nil || !answered(err) {
		return -1, false
	}
	for j, r := range res {
		if r.Error != nil && errors.Is(err, r.Error) {
			if i, ok := claimOf[j]; ok {
				return i, true
			}
			return -1, true
		}
	}
	return -1, false
}

// holdSet looks at the nodes es, just made for claims, as TryAcquire does,
// all at once, and grants them all or none (ErrNotAcquired), leaving the
// nodes to the caller.
func (d *Driver) holdSet(ctx context.Context, claims []backend.Claim, es []*entry) ([]backend.Grant, error) {
	ts := make([]*ticket, len(es))
	held, errs := make([]bool, len(es)), make([]error, len(es))
	var wg sync.WaitGroup
	for i, e := range es {
		ts[i] = &ticket{d: d, l: claims[i], e: e}
		if !e.first {
			wg.Go(func() { held[i], errs[i] = ts[i].stand(ctx) })
		}
	}
	wg.Wait()
	for i, e := range es {
		switch {
		case errors.Is(errs[i], errGone):
			return nil, d.goneErr(e)
		case errs[i] != nil:
			return nil, errs[i]
		case !e.first && !held[i]:
			return nil, fmt.Errorf("%w: %s", backend.ErrNotAcquired, claims[i].Key)
		}
	}
	gs := make([]backend.Grant, len(es))
	for i, e := range es {
		g, err := d.grant(ctx, e, claims[i])
		if err != nil {
			for _, l := range claims[:i] {
				d.unhold(l.Token)
			}
			if errors.Is(err, errGone) {
				err = d.goneErr(e)
			}
			return nil, err
		}
		gs[i] = g
	}
	return gs, nil
}

// ReleaseAll implements backend.SetAcquirer: the nodes (and markers) in
// one multi-op; when it fails, each as Release would, which reports the
// one gone.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	ctx, done, err := d.enter(ctx, "release")
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer done()
	type node struct {
		i            int
		path, marker string
		session      int64
	}
	var ns []node
	var ops []any
	for i, l := range claims {
		path, marker, session, err := d.heldNode(ctx, l, d.unhold(l.Token), true)
		if err != nil {
			errs[i] = permitted(err)
			continue
		}
		ns = append(ns, node{i, path, marker, session})
		ops = append(ops, &zk.DeleteRequest{Path: path, Version: -1})
		if marker != "" {
			ops = append(ops, &zk.DeleteRequest{Path: marker, Version: -1})
		}
	}
	if len(ns) == 0 {
		return errs
	}
	_, err = callInline(ctx, d, func() ([]zk.MultiResponse, error) {
		return request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
	})
	if err == nil {
		return errs
	}
	var wg sync.WaitGroup
	for _, n := range ns {
		wg.Go(func() { errs[n.i] = permitted(d.deleteHeld(ctx, n.path, n.marker, n.session, !answered(err))) })
	}
	wg.Wait()
	return errs
}
