package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// A semaphore's resize record is a persistent child of its queue's node,
// so that the listing a look makes anyway shows it: a semaphore never
// resized costs no request more. Its data is the limit and the last node
// holding when it was written; a delete and a create in one multi-op
// replace it, which wakes the waiters watching the children (see
// docs/backends/zklock.md, Resizing a semaphore).
const resizeName = "limit"

// resized is a semaphore's resize record.
type resized struct {
	limit   int   // the limit every claim is judged under; 0: removed (upto's hold)
	upto    int64 // the nodes up to this sequence number held when it was written (-1: none)
	version int32 // the record's node's, as read
}

func (r resized) data() []byte {
	return []byte(strconv.Itoa(r.limit) + " " + strconv.FormatInt(r.upto, 10))
}

// readResized reads the resize record under parent when names, parent's
// children, list it: nil when they do not, or it went since.
func (d *Driver) readResized(parent string, names []string) (*resized, error) {
	if !slices.Contains(names, resizeName) {
		return nil, nil
	}
	data, st, err := d.conn.Get(parent + "/" + resizeName)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil, nil
	case err != nil:
		return nil, err
	}
	limit, upto, _ := strings.Cut(string(data), " ")
	rec := resized{version: st.Version}
	rec.limit, err = strconv.Atoi(limit)
	if err == nil {
		rec.upto, err = strconv.ParseInt(upto, 10, 64)
	}
	if err != nil || rec.limit < 0 || rec.limit > backend.MaxLimit || rec.limit == 0 && rec.upto < 0 {
		return nil, fmt.Errorf("%w: the resize record %s/%s reads %q", errUnexpected, parent, resizeName, data)
	}
	return &rec, nil
}

// Resize implements backend.Resizer: it reads the queue and the record,
// then writes the record (the old one's version checked) with the last
// node holding, which keeps holding under a lowered limit. Limit 0 deletes
// it, or, while its holders are not those the claims' own limits make,
// keeps their last, with no limit (see forgetInert).
func (d *Driver) Resize(ctx context.Context, key string, limit int) (err error) {
	parent := d.queueParent(backend.Claim{Key: key, Mode: backend.Permit})
	return d.operate(ctx, "resize", func(ctx context.Context) error {
		return d.retrying(ctx, func() error { return d.resize(ctx, parent, limit) })
	})
}

// resize is one try of Resize: errChanged when the queue's node or the
// record changed under it.
func (d *Driver) resize(ctx context.Context, parent string, limit int) error {
	lk, err := d.sharedListing(ctx, parent, backend.Permit, nil, false)
	names, old := lk.names, lk.r
	switch {
	case err != nil:
		return err
	case old == nil && limit == 0, old != nil && old.limit == limit:
		return nil
	}
	held := holders(names, old)
	r := resized{limit: limit, upto: -1}
	if len(held) > 0 {
		r.upto = held[len(held)-1]
	}
	path := parent + "/" + resizeName
	var ops []any
	if old != nil {
		ops = append(ops, &zk.DeleteRequest{Path: path, Version: old.version})
	}
	if limit > 0 || !slices.Equal(held, holders(names, nil)) {
		ops = append(ops, &zk.CreateRequest{Path: path, Data: r.data(), Acl: d.acl})
	}
	_, err = call(ctx, d, func() ([]zk.MultiResponse, error) {
		return request(d, func() ([]zk.MultiResponse, error) { return d.conn.Multi(ops...) })
	})
	switch {
	case errors.Is(err, zk.ErrNoNode) && old == nil:
		// The name's node is missing (never made, or gone once empty).
		if _, err := d.ensureParent(parent); err != nil {
			return err
		}
		return errChanged
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists):
		return errChanged // another Resize's
	}
	return err // a lost answer: the next try finds the record written, or not
}

// holders is the sequence numbers of the nodes of a semaphore's queue
// that hold under its record r (nil: none), in order.
func holders(names []string, r *resized) []int64 {
	nodes, _ := queueNodes(names)
	holding(nodes, backend.Permit, r)
	var seqs []int64
	for _, n := range nodes {
		if n.holds {
			seqs = append(seqs, n.seq)
		}
	}
	return seqs
}

// forgetInert deletes r, a removed limit's record, once it keeps nothing
// (its holders are those the claims' own limits make): the first look
// after its own holders went does it.
func (d *Driver) forgetInert(parent string, names []string, r *resized) {
	if r == nil || r.limit > 0 || !slices.Equal(holders(names, r), holders(names, nil)) {
		return
	}
	if err := d.conn.Delete(parent+"/"+resizeName, r.version); err != nil {
		d.log.Debug("zklock: delete of a removed limit's record failed", "path", parent+"/"+resizeName, "err", err)
	}
}
