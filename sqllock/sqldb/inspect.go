package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// known is what a row records: owner, fence and expiry. Waiters poll and
// leave no trace in the table.
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL

// listPage is how many rows one statement of List reads.
const listPage = 500

func heldState(key, owner string, fence, us int64) backend.State {
	return backend.State{Key: key, Held: true, Owner: owner, Fence: uint64(fence), TTL: time.Duration(us) * time.Microsecond, Known: known}
}

// Inspect implements backend.Inspector with one SELECT of the key's live
// row, or SELECTs of its semaphore's or read-write lock's live holders
// (List's, for the one name), and of a semaphore's limit record; the TTL
// is by the database's clock.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	m = backend.Object(m)
	if err := d.modeOK(m); err != nil {
		return backend.State{}, err
	}
	ctx, leave, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
	if m != backend.Exclusive {
		sts, err := d.list(ctx, m, key, []byte(key+"\x00"))
		if err != nil {
			return backend.State{}, d.wrap("", err)
		}
		st := objects.Free(key, m)
		if len(sts) > 0 {
			st = sts[0]
		}
		if m == backend.Permit {
			// A resized semaphore's limit, held or free: its record.
			live, err := liveRows(on{ctx, d, nil}, key, objSemaphore)
			if err != nil {
				return backend.State{}, d.wrap("", err)
			}
			if r := resized(live); r > 0 {
				st.Limit = r
			}
		}
		return st, nil
	}
	st, err := d.inspect(ctx, key)
	if err != nil {
		return backend.State{}, d.wrap("", err)
	}
	return st, nil
}

func (d *Driver) inspect(ctx context.Context, key string) (backend.State, error) {
	var (
		owner     string
		fence, us int64
	)
	err := d.db.QueryRowContext(ctx, d.sql.inspect, key).Scan(&owner, &fence, &us)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return backend.State{Key: key, Known: known}, nil
	case err != nil:
		return backend.State{}, err
	}
	return heldState(key, owner, fence, us), nil
}

// List implements backend.Lister: pages of SELECTs over the live rows
// whose name starts with prefix (of locks, or of semaphores' or
// read-write locks' holders), in the names' byte order.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	m = backend.Object(m)
	if err := d.modeOK(m); err != nil {
		return nil, err
	}
	ctx, leave, err := d.begin(ctx, "")
	if err != nil {
		return nil, err
	}
	defer leave()
	var hi []byte // the first byte string above every name with the prefix
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] != 0xff {
			hi = append([]byte(prefix[:i]), prefix[i]+1)
			break
		}
	}
	if hi == nil && prefix != "" {
		return nil, nil // all 0xff: no UTF-8 name starts so
	}
	out, err := d.list(ctx, m, prefix, hi)
	if err != nil {
		return nil, d.wrap("", err)
	}
	return out, nil
}

// list reads the held objects m whose names are ≥ from and, unless hi is
// nil, < hi, a page at a time.
func (d *Driver) list(ctx context.Context, m backend.Mode, from string, hi []byte) ([]backend.State, error) {
	var out []backend.State
	var after int64
	for {
		n, err := d.listPage(on{ctx, d, nil}, &out, m, from, after, hi, listPage)
		if err != nil {
			return nil, err
		}
		if n < listPage {
			return out, nil
		}
		last := out[len(out)-1]
		if m == backend.Exclusive {
			from = last.Key + "\x00" // the next name up
		} else {
			from, after = last.Key, int64(last.Holders[len(last.Holders)-1].Fence) // the next holder
		}
	}
}

// listPage appends a page of at most limit rows of objects m, from the
// holder (from, after) on (after matters for semaphores and read-write
// locks alone), to out and returns its length in rows.
func (d *Driver) listPage(o on, out *[]backend.State, m backend.Mode, from string, after int64, hi []byte, limit int) (int, error) {
	var bound any
	if hi != nil {
		bound = hi
	}
	query, args := d.sql.list, []any{from, bound, bound, limit}
	if m != backend.Exclusive {
		obj, _ := objectOf(m)
		query, args = d.sql.sharedList, []any{obj, from, bound, bound, from, after, limit}
	}
	rows, err := o.query(query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			name, owner       string
			fence, us, packed int64
			kind              int
		)
		if m == backend.Exclusive {
			err = rows.Scan(&name, &owner, &fence, &us)
			*out = append(*out, heldState(name, owner, fence, us))
		} else {
			err = rows.Scan(&name, &kind, &owner, &fence, &packed, &us)
			*out = objects.Add(*out, m, name, kind, owner, fence, packed, us)
		}
		if err != nil {
			return 0, err
		}
		n++
	}
	return n, rows.Err()
}

// Break implements backend.Breaker: a SELECT of the key's holder, and a
// statement that frees its row under that fence, as a release does (a
// permit's, reader's or writer's under its object's anchor, in one
// transaction), which wakes this driver's waiters. The removed holder's
// next Refresh finds no row of its token; the next grant draws a fence
// above.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	m = backend.Object(m)
	if err := d.modeOK(m); err != nil {
		return backend.State{}, err
	}
	ctx, leave, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
	var st backend.State
	if m == backend.Exclusive {
		st, err = d.breakLock(ctx, key, fence)
	} else {
		st, err = d.breakHolder(ctx, key, m, fence)
	}
	switch {
	case err != nil:
		return backend.State{}, d.wrap("", err)
	case !st.Held:
		return backend.State{}, fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	d.hub.notify(key)
	return st, nil
}

// breakLock frees the lock's holder of fence, and returns its state; one
// not held when it had another fence or none.
func (d *Driver) breakLock(ctx context.Context, key string, fence uint64) (backend.State, error) {
	st, err := d.inspect(ctx, key)
	if err != nil || !st.Held || st.Fence != fence {
		return backend.State{}, err
	}
	if n, err := d.exec(ctx, d.sql.breakLock, key, int64(fence)); err != nil || n == 0 {
		return backend.State{}, err
	}
	return st, nil
}

// breakHolder frees the permit, reader or writer of fence under the
// object's anchor, as a release does, and returns the object's state with
// that holder alone; one not held when no live holder had fence.
func (d *Driver) breakHolder(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	obj, _ := objectOf(m)
	var st []backend.State
	err := d.underAnchor(ctx, key, obj, func(tx on) error {
		// The first live holder from fence on.
		st = nil
		if _, err := d.listPage(tx, &st, m, key, int64(max(fence, 1)-1), []byte(key+"\x00"), 1); err != nil || len(st) == 0 {
			return err
		}
		if st[0].Holders[0].Fence != fence {
			st = nil
			return nil
		}
		res, err := tx.exec(d.sql.sharedBreak, key, obj, int64(fence))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			st = nil
			return err
		}
		return nil
	})
	if err != nil || len(st) == 0 {
		return backend.State{}, err
	}
	return st[0], nil
}
