package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// TryAcquireAll implements backend.SetAcquirer: one multi-op makes every
// claim's queue node (create); the other queues are listed at once,
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
	if d.multiBytes(claims) > maxMultiBytes {
		return nil, fmt.Errorf("zklock: try-acquire: a set of %d names, more than one request takes: %w", len(claims), backend.ErrUnsupported)
	}
	ctx, done, err := d.enter(ctx, "try-acquire")
	if err != nil {
		return nil, err
	}
	defer done()
	bo := newBackoff()
	for try := 1; ; try++ {
		es, err := creating(ctx, d, func(ctx context.Context, inline bool) ([]*entry, error) {
			return d.create(ctx, claims, false, inline)
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
		if es != nil || try == 3 || !transient(err) || !bo.Pause(ctx) {
			return nil, fmt.Errorf("zklock: try-acquire: %w", d.gate.Failed(ctx, err))
		}
	}
}

// maxMultiBytes bounds a set's multi-op: the server drops the connection
// that sends a request past its jute.maxbuffer (1 MiB by default), and
// the session's every lock loses contact. Half of it, for what
// multiBytes leaves out.
const maxMultiBytes = 512 << 10

// multiBytes is about the size of create's multi-op for claims: per name,
// its node's and its queue node's creates, with paths, ACLs and data, and
// a write of its node.
func (d *Driver) multiBytes(claims []backend.Claim) int {
	acl := 0
	for _, a := range d.acl {
		acl += 12 + len(a.Scheme) + len(a.ID)
	}
	n := 0
	for _, l := range claims {
		// 128: the queue node's head, hash and sequence, and each op's header.
		n += 3*len(d.queueParent(l)) + 2*acl + len(l.Owner) + 128
	}
	return n
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
				d.unhold(l.Token, "")
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
		path, marker, session, err := d.heldNode(ctx, l, d.unhold(l.Token, ""), true)
		if err != nil {
			errs[i] = permitted(err)
			continue
		}
		ns = append(ns, node{i, path, marker, session})
		ops = deleteOps(ops, path, marker)
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
