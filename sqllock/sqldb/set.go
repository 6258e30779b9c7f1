package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/micros"
)

var _ backend.SetAcquirer = (*Driver)(nil)

// TryAcquireAll implements backend.SetAcquirer with one statement,
// grantMany, which takes every name or none; where the dialect's meets
// rows that it does not take itself (SQLite's expired ones), as TryAcquire
// does: takeoverMany, then grantMany again.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	n := len(claims)
	if n == 0 {
		return nil, nil
	}
	if n > d.sql.maxBatch {
		return nil, fmt.Errorf("%sa set of %d names: %w", d.prefix(""), n, backend.ErrUnsupported)
	}
	args := make([]any, 0, 4*n)
	us := make([]int64, n)
	for i, c := range claims {
		if c.Mode != backend.Exclusive {
			return nil, fmt.Errorf("%sa set of %s claims: %w", d.prefix(""), c.Mode, backend.ErrUnsupported)
		}
		var err error
		if us[i], err = micros.Of(d.prefix(""), c.TTL); err != nil {
			return nil, err
		}
		args = append(args, c.Key, c.Token, c.Owner, us[i])
	}
	ctx, leave, err := d.begin(ctx, "acquire")
	if err != nil {
		return nil, err
	}
	defer leave()
	var fences []int64
	var sent time.Time
	err = d.write(ctx, func(ctx context.Context) error {
		var err error
		fences, sent, err = d.grantMany(ctx, claims, args)
		return err
	}, func(ctx context.Context) error {
		for i, c := range claims {
			fence := int64(0)
			if fences != nil {
				fence = fences[i]
			}
			d.forgetLive(ctx, c, fence) // the Client may take the names one by one with the same claims
		}
		return nil
	})
	if err != nil {
		return nil, d.acquireErr(err)
	}
	grants := make([]backend.Grant, n)
	for i := range grants {
		grants[i] = backend.Grant{Fence: uint64(fences[i]), TTL: time.Duration(us[i]) * time.Microsecond, Sent: sent}
	}
	return grants, nil
}

// grantMany runs TryAcquireAll's statements and returns the fences, in
// the claims' order, and when the statement that took them was sent.
func (d *Driver) grantMany(ctx context.Context, claims []backend.Claim, args []any) ([]int64, time.Time, error) {
	n := len(claims)
	for took := false; ; took = true {
		fences, sent, err := d.insertMany(ctx, claims, args)
		if err == nil || took || d.sql.takeoverMany == nil || d.dialect.classify(err) != errDuplicate {
			return fences, sent, err
		}
		res, _, err := d.writeAs(ctx, true, d.hot(d.sql.takeoverMany(n), n), args, nil)
		if err != nil {
			return nil, sent, err
		}
		if k, err := res.RowsAffected(); err != nil || k == 0 {
			return nil, sent, orErr(err, errHeld)
		}
	}
}

// insertMany runs grantMany and returns each claim's fence.
func (d *Driver) insertMany(ctx context.Context, claims []backend.Claim, args []any) ([]int64, time.Time, error) {
	n := len(claims)
	fences := make([]int64, n)
	if !d.sql.returning {
		res, sent, err := d.writeAs(ctx, true, d.hot(d.sql.grantMany(n), n), args, nil)
		if err != nil {
			return nil, sent, err
		}
		fence, err := res.LastInsertId()
		if err == nil && fence <= 0 {
			err = fmt.Errorf("the set's statement returned fence %d", fence)
		}
		for i := range fences {
			fences[i] = fence
		}
		return fences, sent, err
	}
	at := keyIndex(claims)
	got := 0
	_, sent, err := d.writeAs(ctx, true, d.hot(d.sql.grantMany(n), n), args, func(rows *sql.Rows) error {
		for rows.Next() {
			var key string
			var fence int64
			if err := rows.Scan(&key, &fence); err != nil {
				return err
			}
			if i, ok := at[key]; ok && fences[i] == 0 {
				fences[i] = fence
				got++
			}
		}
		return rows.Err()
	})
	if err == nil && got < n {
		err = fmt.Errorf("the set's statement returned %d fences of %d", got, n)
	}
	return fences, sent, err
}

// ReleaseAll implements backend.SetAcquirer with one statement,
// releaseMany: a claim it did not free, or every claim when it failed,
// is released alone, which tells not held from cannot tell.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	n := len(claims)
	errs := make([]error, n)
	if n == 0 {
		return errs
	}
	args := make([]any, 0, 4*n)
	for _, c := range claims {
		if c.Mode != backend.Exclusive || c.Fence == 0 || n > d.sql.maxBatch {
			return d.releaseEach(ctx, claims, errs)
		}
		args = append(args, c.Key, c.Token, int64(c.Fence))
	}
	for _, c := range claims {
		args = append(args, c.Key)
	}
	bctx, leave, err := d.begin(ctx, "release")
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	freed, err := d.releaseMany(bctx, claims, args)
	leave()
	for i, c := range claims {
		if err == nil && freed[i] {
			d.hub.notify(c.Key)
			continue
		}
		errs[i] = d.Release(ctx, c)
	}
	return errs
}

// releaseMany runs ReleaseAll's statements and returns which claims they
// freed.
func (d *Driver) releaseMany(ctx context.Context, claims []backend.Claim, args []any) ([]bool, error) {
	n := len(claims)
	freed := make([]bool, n)
	at := keyIndex(claims)
	scan := func(rows *sql.Rows) error {
		for rows.Next() {
			var key string
			if err := rows.Scan(&key); err != nil {
				return err
			}
			if i, ok := at[key]; ok {
				freed[i] = true
			}
		}
		return rows.Err()
	}
	if d.sql.returning {
		_, _, err := d.writeAs(ctx, false, d.hot(d.sql.releaseMany(n), n), args, scan)
		return freed, err
	}
	res, _, err := d.writeAs(ctx, false, d.hot(d.sql.releaseMany(n), n), args, nil)
	if err != nil {
		if d.dialect.classify(err) == errRaised {
			err = nil // freed none: a claim is not held
		}
		return freed, err
	}
	k, err := res.RowsAffected()
	if err != nil {
		return freed, err
	}
	if k < int64(n) {
		// Names without a row: the others are the claims' tombstones.
		pairs := make([]any, 0, 2*n)
		for _, c := range claims {
			pairs = append(pairs, c.Key, int64(c.Fence))
		}
		rows, err := on{ctx, d, nil}.query(d.hot(d.sql.releasedMany(n), n), pairs...)
		if err != nil {
			return freed, err
		}
		defer rows.Close()
		return freed, scan(rows)
	}
	for i := range freed {
		freed[i] = true
	}
	return freed, nil
}

// releaseEach releases each claim with its own statements.
func (d *Driver) releaseEach(ctx context.Context, claims []backend.Claim, errs []error) []error {
	for i, c := range claims {
		errs[i] = d.Release(ctx, c)
	}
	return errs
}

// keyIndex maps each claim's key to its position.
func keyIndex(claims []backend.Claim) map[string]int {
	at := make(map[string]int, len(claims))
	for i, c := range claims {
		at[c.Key] = i
	}
	return at
}
