package zklock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/internal/parallel"
)

// abandon deletes queue nodes for a call about to return: it waits for
// the answer, but once ctx is done only quickWait, so that a caller who
// gave up is not held by a dead connection (see abandonAsync).
func (d *Driver) abandon(ctx context.Context, es ...*entry) {
	done := d.abandonAsync(es...)
	t := time.NewTimer(d.ttl)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-d.done:
	case <-ctx.Done():
		parallel.Within(done, d.quickWait())
	}
}

// abandonAsync deletes queue nodes in the background, in one multi-op when
// their names are known (else found by token hash), retrying a failed
// delete while the node's session may live; the channel closes when done.
func (d *Driver) abandonAsync(es ...*entry) <-chan struct{} {
	done := make(chan struct{})
	f := func() {
		defer close(done)
		if len(es) > 1 && d.deleteAll(es) == nil {
			return
		}
		var wg sync.WaitGroup
		for _, e := range es {
			wg.Go(func() { d.abandonOne(e) })
		}
		wg.Wait()
	}
	switch {
	case d.spawn(f):
	case d.own:
		close(done) // closed: the session, and its nodes, ended with it
	default:
		go f() // a ticket left after Close: the caller's connection lives on, and one try
	}
	return done
}

// deleteAll deletes the nodes es, and their markers, in one multi-op.
func (d *Driver) deleteAll(es []*entry) error {
	var ops []any
	for _, e := range es {
		if e.name == "" {
			return errGone
		}
		ops = deleteOps(ops, e.path(), e.marker())
	}
	_, err := request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
	return err
}

// deleteOps appends to ops the deletes of node path and its marker, if any.
func deleteOps(ops []any, path, marker string) []any {
	ops = append(ops, &zk.DeleteRequest{Path: path, Version: -1})
	if marker != "" {
		ops = append(ops, &zk.DeleteRequest{Path: marker, Version: -1})
	}
	return ops
}

func (d *Driver) abandonOne(e *entry) {
	if e.name == "" {
		d.reapHash(e.parent, e.hash, e.session)
		return
	}
	_, err := request(d, func() (struct{}, error) { return struct{}{}, d.deleteWith(e.path(), e.marker(), -1) })
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		// Its name, not its hash: the Client may queue the same token again.
		d.dropLost(e.path(), e.marker(), e.session)
	}
}

// reapHash deletes every node of a token hash under parent (its marker
// last), retrying until none is left, the driver closes or their session
// (if known) is gone, and they with it.
func (d *Driver) reapHash(parent, hash string, session int64) {
	bo := newBackoff()
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
				if _, h, _, ok := parseTagged(n); ok && h == hash {
					if err := d.conn.Delete(parent+"/"+n, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
						left = true
					}
				}
			}
			if m := markerPrefix + hash; !left && slices.Contains(names, m) {
				if err := d.conn.Delete(parent+"/"+m, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
					left = true
				}
			}
			if !left {
				return
			}
		}
		if !bo.Pause(d.gate.Context()) {
			return
		}
	}
	d.log.Warn("zklock: could not delete an abandoned queue node; it goes with the session", "parent", parent)
}
