package sqldb

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/micros"
)

// RefreshMany implements backend.BatchRefresher: per batch of up to the
// dialect's maxBatch claims, one UPDATE refreshes every live row that its
// claim still holds, and one SELECT finds which those are (a row live
// after the UPDATE with its claim's token, fence and owner was live at
// it, so the UPDATE extended it).
func (d *Driver) RefreshMany(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	var pos, shared []int
	var args []any
	for i, c := range claims {
		us, err := micros.Of(d.prefix(""), c.TTL)
		switch {
		case err != nil:
			errs[i] = err
		case c.Mode != backend.Exclusive:
			shared = append(shared, i)
		default:
			pos = append(pos, i)
			args = append(args, int64(i), c.Key, c.Token, int64(c.Fence), c.Owner, us)
		}
	}
	if len(pos)+len(shared) == 0 {
		return errs
	}
	ctx, leave, err := d.begin(ctx, "refresh")
	if err != nil {
		return failAt(errs, append(pos, shared...), err)
	}
	defer leave()
	// Permits, readers and writers one by one: a semaphore's holders
	// are few.
	for _, i := range shared {
		if errs[i] = d.modeOK(claims[i].Mode); errs[i] == nil {
			us, _ := micros.Of("", claims[i].TTL)
			errs[i] = d.refreshShared(ctx, claims[i], us)
		}
	}
	const per = 6 // arguments a claim
	for len(pos) > 0 {
		n := min(len(pos), d.sql.maxBatch)
		d.refreshBatch(ctx, errs, pos[:n], args[:n*per])
		pos, args = pos[n:], args[n*per:]
	}
	return errs
}

// refreshBatch is RefreshMany for the claims at pos, with their args.
func (d *Driver) refreshBatch(ctx context.Context, errs []error, pos []int, args []any) {
	n := len(pos)
	if _, err := d.write1(ctx, d.sql.refreshMany(n), args...); err != nil {
		failAt(errs, pos, d.wrap("refresh", err))
		return
	}
	rows, err := d.db.QueryContext(ctx, d.sql.heldMany(n), args...)
	if err != nil {
		failAt(errs, pos, d.wrap("refresh", err))
		return
	}
	defer rows.Close()
	held := make(map[int64]bool, n)
	for rows.Next() {
		var i int64
		if err := rows.Scan(&i); err != nil {
			failAt(errs, pos, d.wrap("refresh", err))
			return
		}
		held[i] = true
	}
	if err := rows.Err(); err != nil {
		failAt(errs, pos, d.wrap("refresh", err))
		return
	}
	for _, i := range pos {
		if !held[int64(i)] {
			errs[i] = fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
		}
	}
}

// failAt sets err for the claims at pos.
func failAt(errs []error, pos []int, err error) []error {
	for _, i := range pos {
		errs[i] = err
	}
	return errs
}
