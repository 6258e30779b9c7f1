package zklock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
	"github.com/lockerhq/locker/internal/retry"
)

// known is what a lock's queue records: its nodes in order, each with its
// owner as data and its creation zxid, the fence; not the time left (a
// node has no expiry: the holder's session is the server's business).
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsWaiters | backend.KnowsQueue

// readers bounds the reads Inspect and List have in flight at once.
const readers = 32

// qnode is one node of a queue as read.
type qnode struct {
	snode          // its name, tag and sequence number
	owner   string // its data
	czxid   int64
	version int32
	gone    bool // deleted between the listing and the read
	marker  bool // a lost lock's delay marker (delay.go)
	holds   bool // a semaphore's or read-write lock's node that holds (holding)
}

// Inspect implements backend.Inspector: a listing of the queue of key's
// object m and a read of each node.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (st backend.State, err error) {
	if m, err = object(m); err == nil {
		err = d.operate(ctx, "inspect", func(ctx context.Context) (err error) {
			st, err = d.objectState(ctx, key, m)
			return err
		})
	}
	if err != nil {
		return backend.State{}, err
	}
	return st, nil
}

// operate runs f, an operator's call (Inspect, List, Break, Resize),
// through the gate, once our server applied every write the leader had
// committed: a lock another client took through another member must show.
func (d *Driver) operate(ctx context.Context, op string, f func(ctx context.Context) error) error {
	ctx, done, err := d.enter(ctx, op)
	if err != nil {
		return err
	}
	defer done()
	err = d.retrying(ctx, func() error {
		_, err := call(ctx, d, func() (string, error) { return d.conn.Sync(d.root) })
		if errors.Is(err, zk.ErrNoNode) {
			err = nil // no lock was ever taken under the root
		}
		return err
	})
	if err == nil {
		err = f(ctx)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, backend.ErrNotHeld):
		return fmt.Errorf("zklock: %s: %w", op, err) // an answer, whatever became of ctx since
	}
	return permitted(fmt.Errorf("zklock: %s: %w", op, d.gate.Failed(ctx, err)))
}

// object is the object of mode m for Inspect, List and Break; a mode the
// driver does not take is refused before any request.
func object(m backend.Mode) (backend.Mode, error) {
	if m > backend.Write {
		return 0, fmt.Errorf("zklock: %v: %w", m, backend.ErrUnsupported)
	}
	return backend.Object(m), nil
}

// objectState reads the state of key's object m (Exclusive, Permit, Read).
func (d *Driver) objectState(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m == backend.Exclusive {
		return d.queueState(ctx, key)
	}
	return d.sharedState(ctx, key, m)
}

// queueState reads key's queue: the holder is its first node (or a lost
// lock's delay marker that keeps the name), the waiters the others. A
// holder gone between the listing and its read makes it look again.
func (d *Driver) queueState(ctx context.Context, key string) (backend.State, error) {
	parent := d.parentPath(key)
	st := backend.State{Key: key, Known: known}
	err := d.retrying(ctx, func() error {
		nodes, markers, err := d.listing(ctx, parent)
		if err != nil {
			return err
		}
		for _, m := range deadMarkers(nodes, markers) {
			nodes = append(nodes, qnode{snode: snode{name: m}, marker: true})
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

// retrying runs f through store failures and changes of the queue under
// it (errChanged) for up to retry.Budget.
func (d *Driver) retrying(ctx context.Context, f func() error) error {
	return retry.Call(ctx, *newBackoff(), retry.Budget, func(err error) bool {
		return errors.Is(err, errChanged) || transient(err)
	}, func(context.Context) error { return f() })
}

// listing lists the nodes of parent's queue, first (the holder) first,
// and the delay markers beside them (only a lock's queue has any); none
// when the name's node does not exist.
func (d *Driver) listing(ctx context.Context, parent string) (nodes []qnode, markers []string, err error) {
	names, err := d.children(ctx, parent)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	nodes, markers = queueNodes(names)
	return nodes, markers, nil
}

// queueNodes is listing's reading of names, a queue's children.
func queueNodes(names []string) (nodes []qnode, markers []string) {
	for _, n := range names {
		if tag, _, seq, ok := parseTagged(n); ok {
			nodes = append(nodes, qnode{snode: snode{n, tag, seq}})
		} else if _, ok := markerHash(n); ok {
			markers = append(markers, n)
		}
	}
	slices.SortFunc(nodes, func(a, b qnode) int { return cmp.Compare(a.seq, b.seq) })
	return nodes, markers
}

// readNodes reads the owner (data), creation zxid and version of nodes.
func (d *Driver) readNodes(ctx context.Context, parent string, nodes []qnode) error {
	_, err := call(ctx, d, func() (struct{}, error) {
		return struct{}{}, errors.Join(parallel.Each(len(nodes), readers, func(i int) error {
			n := &nodes[i]
			r, err := d.get(parent + "/" + n.name)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				n.gone = true
			case err != nil:
				return err
			default:
				n.owner, n.czxid, n.version = string(r.data), r.st.Czxid, r.st.Version
			}
			return nil
		})...)
	})
	return err
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
// are the objects' nodes (objectHead and the escaped name), then each
// matching object's queue, a few at a time.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) (out []backend.State, err error) {
	if m, err = object(m); err != nil {
		return nil, err
	}
	err = d.operate(ctx, "list", func(ctx context.Context) error {
		var names []string
		err := d.retrying(ctx, func() error {
			var err error
			names, err = d.children(ctx, d.root)
			if errors.Is(err, zk.ErrNoNode) {
				return nil // no lock was ever taken under the root
			}
			return err
		})
		if err != nil {
			return err
		}
		head := objectHead(m)
		var keys []string
		for _, n := range names {
			esc, ok := strings.CutPrefix(n, head)
			key, err := url.PathUnescape(esc)
			if ok && err == nil && strings.HasPrefix(key, prefix) && backend.EscapeKey(key) == esc {
				keys = append(keys, key)
			}
		}
		slices.Sort(keys)
		sts := make([]backend.State, len(keys))
		err = errors.Join(parallel.Each(len(keys), 8, func(i int) (err error) {
			sts[i], err = d.objectState(ctx, keys[i], m)
			return err
		})...)
		for _, st := range sts {
			if st.Held {
				out = append(out, st)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// target is the node a Break deletes, its marker ("" if none), its version
// as read, and the state Break reports.
type target struct {
	path, marker string
	version      int32
	st           backend.State
}

// errDeleted: the node of a delete whose answer was lost is gone.
var errDeleted = errors.New("the node is gone")

// Break implements backend.Breaker: it reads the queue of key's object m,
// finds the grant whose fence (its node's creation zxid) is fence, and
// deletes its node with the version read: a node name is never reused, so
// path and version name that very node, still holding. The next holder's
// node, made later, has a greater zxid; the removed holder's driver sees
// the deletion on its watch and reports the loss; waiters look again as
// after a release.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (_ backend.State, err error) {
	if m, err = object(m); err != nil {
		return backend.State{}, err
	}
	var t target
	tried := "" // a delete of this node lost its answer
	err = d.operate(ctx, "break", func(ctx context.Context) error {
		return d.retrying(ctx, func() error {
			var next target
			var err error
			if m == backend.Exclusive {
				next, err = d.lockTarget(ctx, key, fence, tried)
			} else {
				next, err = d.sharedTarget(ctx, key, m, fence, tried)
			}
			switch {
			case errors.Is(err, errDeleted):
				return nil // most likely by that delete
			case err != nil:
				return err
			case next.path == "":
				return backend.ErrNotHeld
			}
			t = next
			_, err = call(ctx, d, func() (struct{}, error) {
				return request(d, func() (struct{}, error) { return struct{}{}, d.deleteWith(t.path, t.marker, t.version) })
			})
			switch {
			case err == nil:
				return nil
			case errors.Is(err, zk.ErrNoNode) && tried == t.path:
				return nil // most likely our own delete, whose answer was lost
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
				return errChanged // released, or written: look again
			case connLost(err):
				tried = t.path
			}
			return err
		})
	})
	if err != nil {
		return backend.State{}, err
	}
	return t.st, nil
}

// lockTarget finds the node of key's lock whose fence is fence: a lost
// lock's delay marker (its zxid is its lock's), or the first node, with
// its marker; no path when neither has it; errDeleted when tried is gone.
func (d *Driver) lockTarget(ctx context.Context, key string, fence uint64, tried string) (target, error) {
	parent := d.parentPath(key)
	nodes, markers, err := d.listing(ctx, parent)
	if err != nil {
		return target{}, err
	}
	if tried != "" && !slices.ContainsFunc(nodes, func(n qnode) bool { return parent+"/"+n.name == tried }) && !slices.Contains(markers, tried[len(parent)+1:]) {
		return target{}, errDeleted
	}
	var t target
	var r getResult
	waiters := len(nodes)
	for _, m := range deadMarkers(nodes, markers) {
		if r, err = call(ctx, d, func() (getResult, error) { return d.get(parent + "/" + m) }); err == nil && uint64(r.st.Czxid) == fence {
			t.path = parent + "/" + m
			_, _, owner, _ := parseMarker(r.data)
			r.data = []byte(owner)
			break
		}
	}
	if t.path == "" {
		if len(nodes) == 0 {
			return target{}, nil
		}
		t.path, waiters = parent+"/"+nodes[0].name, len(nodes)-1
		if m := markerPrefix + hashOf(nodes[0].name); slices.Contains(markers, m) {
			t.marker = parent + "/" + m
		}
		r, err = call(ctx, d, func() (getResult, error) { return d.get(t.path) })
	}
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return target{}, errChanged // released meanwhile: look again
	case err != nil:
		return target{}, err
	case uint64(r.st.Czxid) != fence:
		return target{}, nil
	}
	t.version = r.st.Version
	t.st = backend.State{Key: key, Held: true, Owner: string(r.data), Fence: fence, Waiters: waiters,
		Known: backend.KnowsOwner | backend.KnowsFence | backend.KnowsWaiters}
	return t, nil
}

// sharedState reads the queue of key's semaphore or read-write lock (m).
// A holder gone between the listing and its read makes it look again: a
// waiter may hold in its place.
func (d *Driver) sharedState(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	var st backend.State
	err := d.retrying(ctx, func() error {
		nodes, r, err := d.sharedNodes(ctx, d.queueParent(backend.Claim{Key: key, Mode: m}), m)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(nodes, func(n qnode) bool { return n.holds && n.gone }) {
			return errChanged
		}
		st = sharedOf(key, m, nodes, r, nil)
		return nil
	})
	return st, err
}

// sharedNodes lists and reads the queue under parent of a semaphore or a
// read-write lock (m), in order (by fence), its holders marked, and a
// semaphore's resize record, if any.
func (d *Driver) sharedNodes(ctx context.Context, parent string, m backend.Mode) ([]qnode, *resized, error) {
	lk, err := d.sharedListing(ctx, parent, m, nil, false)
	nodes, _ := queueNodes(lk.names)
	if err != nil || len(nodes) == 0 {
		return nil, lk.r, err
	}
	holding(nodes, m, lk.r)
	return nodes, lk.r, d.readNodes(ctx, parent, nodes)
}

// holding marks the nodes of a semaphore's (with its resize record r) or
// a read-write lock's queue, in order, that hold, as their own looks would
// find them. Every node behind one that waits waits, but for a permit
// asked with another limit (or more than r's), which keeps nobody out.
func holding(nodes []qnode, m backend.Mode, r *resized) {
	ahead := make([]snode, 0, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		var st standing
		if m == backend.Permit {
			limit, weight := permitOf(n.tag)
			st = permitStanding(ahead, n.seq, r, limit, weight)
		} else {
			st = rwStanding(ahead, rwMode(n.tag))
		}
		if !st.held && st.mismatch == nil {
			return
		}
		n.holds = st.held
		ahead = append(ahead, n.snode)
	}
}

// sharedOf is the state of key's object m from sharedNodes: the holders
// keep says yes to (all when nil), the waiters, and a semaphore's limit
// (r's, else its first node's).
func sharedOf(key string, m backend.Mode, nodes []qnode, r *resized, keep func(qnode) bool) backend.State {
	st := backend.State{Key: key, Mode: m, Known: known.For(m)}
	for _, n := range nodes {
		switch {
		case n.holds && (keep == nil || keep(n)):
			h := backend.Holder{Mode: m, Owner: n.owner, Fence: uint64(n.czxid), Weight: 1}
			if m == backend.Permit {
				_, h.Weight = permitOf(n.tag)
			} else {
				h.Mode = rwMode(n.tag)
			}
			st.Holders = append(st.Holders, h)
		case !n.holds && !n.gone:
			st.Queue = append(st.Queue, n.owner)
		}
	}
	switch {
	case r != nil && r.limit > 0:
		st.Limit = r.limit
	case m == backend.Permit && len(nodes) > 0:
		st.Limit, _ = permitOf(nodes[0].tag)
	}
	st.Held, st.Waiters = len(st.Holders) > 0, len(st.Queue)
	return st
}

// sharedTarget is lockTarget for a semaphore or a read-write lock (m).
func (d *Driver) sharedTarget(ctx context.Context, key string, m backend.Mode, fence uint64, tried string) (target, error) {
	parent := d.queueParent(backend.Claim{Key: key, Mode: m})
	nodes, r, err := d.sharedNodes(ctx, parent, m)
	if err != nil {
		return target{}, err
	}
	if tried != "" && !slices.ContainsFunc(nodes, func(n qnode) bool { return parent+"/"+n.name == tried && !n.gone }) {
		return target{}, errDeleted
	}
	// A node gone since the listing reads as czxid 0, no fence.
	i := slices.IndexFunc(nodes, func(n qnode) bool { return n.holds && uint64(n.czxid) == fence })
	if i < 0 {
		return target{}, nil
	}
	n := nodes[i]
	return target{path: parent + "/" + n.name, version: n.version, st: sharedOf(key, m, nodes, r, func(h qnode) bool { return h.name == n.name })}, nil
}
