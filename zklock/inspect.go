package zklock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Lister    = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// known is what a name's queue records: its nodes in sequence order, the
// first the holder's, each with its owner as data and its creation zxid,
// the fence. Not the time left: a node has no expiry of its own, and the
// holder's session timeout and last contact are the server's business
// (another client cannot read them).
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsWaiters | backend.KnowsQueue

// readers bounds the requests Inspect and List have in flight at once: the
// zk client pipelines them on its one connection.
const readers = 32

// qnode is one node of a queue as read.
type qnode struct {
	name   string
	seq    int64
	owner  string
	czxid  int64
	gone   bool // deleted between the listing and the read
	marker bool // a lost lock's delay marker (delay.go)
}

// Inspect implements backend.Inspector: a listing of key's queue, and a
// read of each node in it.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (_ backend.State, err error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "inspect")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	st, err := d.queueState(ctx, key)
	if err != nil {
		return backend.State{}, fmt.Errorf("zklock: %w", d.failed(ctx, err))
	}
	return st, nil
}

// failed is the error of a read that failed with err.
func (d *Driver) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return d.ended(ctx)
	}
	return err
}

// queueState reads key's queue: the holder is its first node, the
// waiters the others. A holder gone between the listing and its read
// (released) makes it look again. A lost lock's delay marker that keeps
// the name is its holder (lost), before the queue.
func (d *Driver) queueState(ctx context.Context, key string) (backend.State, error) {
	parent := d.parentPath(key)
	st := backend.State{Key: key, Known: known}
	if err := d.catchUp(ctx); err != nil {
		return st, err
	}
	err := d.retrying(ctx, func() error {
		nodes, markers, err := d.listing(ctx, parent)
		if err != nil {
			return err
		}
		dead := deadMarkers(nodes, markers)
		for _, m := range dead {
			nodes = append(nodes, qnode{name: m, marker: true})
		}
		if len(nodes) == 0 {
			return nil
		}
		if err := d.readNodes(ctx, parent, nodes); err != nil {
			return err
		}
		nodes, lost := lostHolder(nodes)
		if len(nodes) == 0 && lost == nil {
			return nil
		}
		if lost == nil {
			if nodes[0].gone {
				return errChanged // a new holder, maybe: look again
			}
			lost, nodes = &nodes[0], nodes[1:]
		}
		st.Held, st.Owner, st.Fence = true, lost.owner, uint64(lost.czxid)
		st.Queue = nil
		for _, n := range nodes {
			if !n.gone {
				st.Queue = append(st.Queue, n.owner)
			}
		}
		st.Waiters = len(st.Queue)
		return nil
	})
	return st, err
}

// lostHolder splits the read markers off nodes (appended after them), and
// returns the one that keeps the name, if any: the oldest older than the
// first node, its owner parsed from its data.
func lostHolder(nodes []qnode) ([]qnode, *qnode) {
	i := slices.IndexFunc(nodes, func(n qnode) bool { return n.marker })
	if i < 0 {
		return nodes, nil
	}
	var lost *qnode
	for _, m := range nodes[i:] {
		state, _, owner, ok := parseMarker([]byte(m.owner))
		if m.gone || !ok || state == markWaiting || i > 0 && m.czxid > nodes[0].czxid || lost != nil && m.czxid > lost.czxid {
			continue
		}
		m.owner = owner
		lost = &m
	}
	return nodes[:i], lost
}

// errChanged: the queue changed while read; read it again.
var errChanged = errors.New("the queue kept changing while read")

// retrying runs f, a read, through store failures and changes of the
// queue under it (errChanged) for up to retry.Budget.
func (d *Driver) retrying(ctx context.Context, f func() error) error {
	return retry.Call(ctx, *newBackoff(), retry.Budget, func(err error) bool {
		return errors.Is(err, errChanged) || transient(err)
	}, func(context.Context) error { return f() })
}

// catchUp makes the server this client reads from apply every write the
// leader had committed: an ensemble member may lag, and a lock another
// client took through another member must show in what follows.
func (d *Driver) catchUp(ctx context.Context) error {
	return d.retrying(ctx, func() error {
		_, err := call(ctx, d, func() (string, error) { return d.conn.Sync(d.root) })
		if errors.Is(err, zk.ErrNoNode) {
			err = nil // no lock was ever taken under the root
		}
		return err
	})
}

// queue lists the nodes of parent's queue, first (the holder) first; none
// when the name's node does not exist.
func (d *Driver) queue(ctx context.Context, parent string) ([]qnode, error) {
	nodes, _, err := d.listing(ctx, parent)
	return nodes, err
}

// listing is queue, and the names of the delay markers beside the nodes.
func (d *Driver) listing(ctx context.Context, parent string) (nodes []qnode, markers []string, err error) {
	names, err := d.children(ctx, parent)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		if _, seq, ok := parseNode(n); ok {
			nodes = append(nodes, qnode{name: n, seq: seq})
		} else if _, ok := markerHash(n); ok {
			markers = append(markers, n)
		}
	}
	slices.SortFunc(nodes, func(a, b qnode) int { return cmp.Compare(a.seq, b.seq) })
	return nodes, markers, nil
}

// readNodes reads the data (the owner) and the creation zxid of nodes,
// readers at a time.
func (d *Driver) readNodes(ctx context.Context, parent string, nodes []qnode) error {
	_, err := call(ctx, d, func() (struct{}, error) {
		return struct{}{}, each(len(nodes), readers, func(i int) error {
			n := &nodes[i]
			r, err := d.get(parent + "/" + n.name)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				n.gone = true
			case err != nil:
				return err
			default:
				n.owner, n.czxid = string(r.data), r.st.Czxid
			}
			return nil
		})
	})
	return err
}

// each runs f(i) for every i below n, limit at a time, and joins their
// errors.
func each(n, limit int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

type getResult struct {
	data []byte
	st   *zk.Stat
}

// get reads a node's data and stat.
func (d *Driver) get(path string) (getResult, error) {
	return request(d, func() (getResult, error) {
		data, st, err := d.conn.Get(path)
		return getResult{data, st}, err
	})
}

// List implements backend.Lister: a listing of the root, whose children
// are the escaped names, then each matching name's queue (its holder, and
// its waiters' owners), a few names at a time.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) (_ []backend.State, err error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "list")
	if err != nil {
		return nil, err
	}
	defer done()
	if err := d.catchUp(ctx); err != nil {
		return nil, fmt.Errorf("zklock: %w", d.failed(ctx, err))
	}
	var names []string
	err = d.retrying(ctx, func() error {
		var err error
		names, err = d.children(ctx, d.root)
		if errors.Is(err, zk.ErrNoNode) {
			return nil // no lock was ever taken under the root
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", d.failed(ctx, err))
	}
	var keys []string
	for _, n := range names {
		key, err := url.PathUnescape(n)
		if err == nil && strings.HasPrefix(key, prefix) && backend.EscapeKey(key) == n {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	sts := make([]backend.State, len(keys))
	err = each(len(keys), 8, func(i int) (err error) {
		sts[i], err = d.queueState(ctx, keys[i])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", d.failed(ctx, err))
	}
	out := sts[:0]
	for _, st := range sts {
		if st.Held {
			out = append(out, st)
		}
	}
	return out, nil
}

// Break implements backend.Breaker: it reads the first node of key's
// queue (or a lost lock's delay marker, whose zxid is its lock's) and
// deletes it, with its marker, if its creation zxid is fence, with the version
// read (a node name is never reused, so the path and the version name that
// very node). The next node in line, made later, has a greater zxid; the
// removed holder's driver sees the deletion on its watch of the node and
// reports the lock lost.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (_ backend.State, err error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "break")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	parent := d.parentPath(key)
	var (
		st      backend.State
		notHeld bool
		tried   string // a delete of this node lost its answer
	)
	err = d.retrying(ctx, func() error {
		nodes, markers, err := d.listing(ctx, parent)
		if err != nil {
			return err
		}
		if tried != "" && !slices.ContainsFunc(nodes, func(n qnode) bool { return parent+"/"+n.name == tried }) && !slices.Contains(markers, tried[len(parent)+1:]) {
			return nil // most likely deleted by that delete
		}
		// A lost lock's marker that keeps the name, or the first node.
		var path, marker string
		var r getResult
		waiters := len(nodes)
		for _, m := range deadMarkers(nodes, markers) {
			if r, err = call(ctx, d, func() (getResult, error) { return d.get(parent + "/" + m) }); err == nil && uint64(r.st.Czxid) == fence {
				path = parent + "/" + m
				_, _, owner, _ := parseMarker(r.data)
				r.data = []byte(owner)
				break
			}
		}
		if path == "" {
			if len(nodes) == 0 {
				notHeld = true
				return nil
			}
			path, waiters = parent+"/"+nodes[0].name, len(nodes)-1
			if m := markerPrefix + hashOf(nodes[0].name); slices.Contains(markers, m) {
				marker = parent + "/" + m
			}
			r, err = call(ctx, d, func() (getResult, error) { return d.get(path) })
		}
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return errChanged // released meanwhile: look again
		case err != nil:
			return err
		case uint64(r.st.Czxid) != fence:
			notHeld = true
			return nil
		}
		st = backend.State{Key: key, Held: true, Owner: string(r.data), Fence: fence, Waiters: waiters,
			Known: backend.KnowsOwner | backend.KnowsFence | backend.KnowsWaiters}
		_, err = call(ctx, d, func() (struct{}, error) {
			return request(d, func() (struct{}, error) { return struct{}{}, d.deleteWith(path, marker, r.st.Version) })
		})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode) && tried == path:
			return nil // most likely our own delete, whose answer was lost
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			return errChanged // released, or written: look again
		case connLost(err):
			tried = path
		}
		return err
	})
	switch {
	case err != nil:
		return backend.State{}, fmt.Errorf("zklock: %w", d.failed(ctx, err))
	case notHeld:
		return backend.State{}, fmt.Errorf("zklock: %w", backend.ErrNotHeld)
	}
	return st, nil
}
