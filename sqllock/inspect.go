package sqllock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// known is what a row records: owner, fence and expiry. Waiters listen
// for notifications and leave no trace in the table.
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL

// Inspect implements backend.Inspector with one SELECT of the key's row,
// or of its semaphore's or read-write lock's live holders' rows; the TTL
// is by the server's clock.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m = backend.Object(m); m != backend.Exclusive {
		sts, err := d.holders(ctx, m, d.shared.inspect, key)
		switch {
		case err != nil:
			return backend.State{}, err
		case len(sts) == 0:
			return objects.Free(key, m), nil
		}
		return sts[0], nil
	}
	ctx, leave, err := d.begin(ctx, "", false)
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
	var (
		held        bool
		owner       string
		version, us int64
	)
	err = d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, d.sql.inspect, key).Scan(&held, &owner, &version, &us)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && !held:
		return backend.State{Key: key, Known: known}, nil
	case err != nil:
		return backend.State{}, d.wrap("", err)
	}
	return heldState(key, owner, version, us), nil
}

func heldState(key, owner string, version, us int64) backend.State {
	return backend.State{Key: key, Held: true, Owner: owner, Fence: uint64(version), TTL: time.Duration(us) * time.Microsecond, Known: known}
}

// List implements backend.Lister with one SELECT of the held rows whose
// name starts with prefix, or of the live holders' rows of its
// semaphores or read-write locks.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m = backend.Object(m); m != backend.Exclusive {
		return d.holders(ctx, m, d.shared.list, likePrefix(prefix))
	}
	ctx, leave, err := d.begin(ctx, "", false)
	if err != nil {
		return nil, err
	}
	defer leave()
	var out []backend.State
	err = d.retry(ctx, func() error {
		out = nil
		var (
			name, owner string
			version, us int64
		)
		rows, _ := d.pool.Query(ctx, d.sql.list, likePrefix(prefix)) // its error comes back from ForEachRow
		_, err := pgx.ForEachRow(rows, []any{&name, &owner, &version, &us}, func() error {
			out = append(out, heldState(name, owner, version, us))
			return nil
		})
		return err
	})
	if err != nil {
		return nil, d.wrap("", err)
	}
	return out, nil
}

// Break implements backend.Breaker with one DELETE of the key's row under
// fence, under the name's fence lock as a release, which notifies the
// waiters; or of the permit's, reader's or writer's row under fence, as
// their release. The removed holder's next Refresh finds no row; the next
// grant draws its fence from the sequence, above.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	var kinds []int16
	var err error
	m = backend.Object(m)
	shared := m != backend.Exclusive
	if shared {
		if kinds, err = holderKinds(m); err != nil {
			return backend.State{}, err
		}
	}
	ctx, leave, err := d.begin(ctx, "", shared)
	if err != nil {
		return backend.State{}, err
	}
	defer leave()
	var (
		h     holderRow
		owner string
		us    int64
	)
	err = d.del(ctx, "", func() error {
		if shared {
			return d.pool.QueryRow(ctx, d.shared.breakHolder, key, kinds, int64(fence), d.sql.channel, d.payload(key)).Scan(append(h.dest(), nil)...)
		}
		return d.pool.QueryRow(ctx, d.sql.breakLock, key, int64(fence), d.sql.channel).Scan(&owner, &us)
	})
	switch {
	case err != nil:
		return backend.State{}, err
	case shared:
		return h.add(nil, m)[0], nil
	}
	return heldState(key, owner, int64(fence), us), nil
}

// holderKinds returns the row kinds of the holders of object m (Permit or
// Read), or ErrUnsupported for a mode that names no object.
func holderKinds(m backend.Mode) ([]int16, error) {
	switch m {
	case backend.Permit:
		return []int16{kindPermit}, nil
	case backend.Read:
		return []int16{kindRead, kindWrite}, nil
	}
	return nil, fmt.Errorf("sqllock: %w: mode %v", backend.ErrUnsupported, m)
}

// holders runs a SELECT of the shared table's holders (inspect, list) on
// arg and the kinds of object m, and returns the objects it found.
func (d *Driver) holders(ctx context.Context, m backend.Mode, query, arg string) ([]backend.State, error) {
	kinds, err := holderKinds(m)
	if err != nil {
		return nil, err
	}
	ctx, leave, err := d.begin(ctx, "", true)
	if err != nil {
		return nil, err
	}
	defer leave()
	var out []backend.State
	err = d.retry(ctx, func() error {
		out = nil
		var h holderRow
		rows, _ := d.pool.Query(ctx, query, arg, kinds) // its error comes back from ForEachRow
		_, err := pgx.ForEachRow(rows, h.dest(), func() error {
			out = h.add(out, m)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, d.wrap("", err)
	}
	return out, nil
}

// holderRow is a row of the shared table's holderColumns.
type holderRow struct {
	name, owner        string
	kind               int16
	version, lim, left int64
}

func (h *holderRow) dest() []any {
	return []any{&h.name, &h.kind, &h.owner, &h.version, &h.lim, &h.left}
}

func (h *holderRow) add(out []backend.State, m backend.Mode) []backend.State {
	return objects.Add(out, m, h.name, int(h.kind), h.owner, h.version, h.lim, h.left)
}
