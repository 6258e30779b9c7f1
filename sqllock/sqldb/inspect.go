package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
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
// row; the TTL is by the database's clock.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, leave, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
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
// whose name starts with prefix, in the names' byte order.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
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
	var out []backend.State
	for from := prefix; ; {
		n, err := d.listPage(ctx, &out, from, hi)
		if err != nil {
			return nil, d.wrap("", err)
		}
		if n < listPage {
			return out, nil
		}
		from = out[len(out)-1].Key + "\x00" // the next name up
	}
}

// listPage appends one page of List to out and returns its length.
func (d *Driver) listPage(ctx context.Context, out *[]backend.State, from string, hi []byte) (int, error) {
	var bound any
	if hi != nil {
		bound = hi
	}
	rows, err := d.db.QueryContext(ctx, d.sql.list, from, bound, bound, listPage)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			name, owner string
			fence, us   int64
		)
		if err := rows.Scan(&name, &owner, &fence, &us); err != nil {
			return 0, err
		}
		*out = append(*out, heldState(name, owner, fence, us))
		n++
	}
	return n, rows.Err()
}

// Break implements backend.Breaker: a SELECT of the key's holder, and a
// statement that frees its row under that fence, as a release does,
// which wakes this driver's waiters. The removed holder's next Refresh
// finds no row of its token; the next grant draws a fence above.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, leave, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
	st, err := d.inspect(ctx, key)
	if err != nil {
		return backend.State{}, d.wrap("", err)
	}
	if !st.Held || st.Fence != fence {
		return backend.State{}, fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	n, err := d.exec(ctx, d.sql.breakLock, key, int64(fence))
	switch {
	case err != nil:
		return backend.State{}, d.wrap("", err)
	case n == 0:
		return backend.State{}, fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	d.hub.notify(key)
	return st, nil
}
