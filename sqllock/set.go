package sqllock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/micros"
)

var _ backend.SetAcquirer = (*Driver)(nil)

// errSomeHeld: acquireMany returned fewer rows than keys, which it does
// not do (it takes every key or fails with division_by_zero).
var errSomeHeld = errors.New("a key of the set is held")

// TryAcquireAll implements backend.SetAcquirer with one statement,
// acquireMany: the rows of every key, or none.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	n := len(claims)
	keys, tokens, owners, us := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	at := make(map[string]int, n)
	for i, l := range claims {
		if l.Mode != backend.Exclusive {
			return nil, fmt.Errorf("sqllock: a set of %s claims: %w", l.Mode, backend.ErrUnsupported)
		}
		u, err := micros.Of("sqllock: ", l.TTL)
		if err != nil {
			return nil, err
		}
		keys[i], tokens[i], owners[i], us[i], at[l.Key] = l.Key, l.Token, l.Owner, u, i
	}
	ctx, leave, err := d.begin(ctx, "acquire", false)
	if err != nil {
		return nil, err
	}
	defer leave()
	grants := make([]backend.Grant, n)
	// Idempotent for the same tokens, as acquire: retried after a lost
	// connection.
	err = d.retry(ctx, func() error {
		c, err := d.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		// Prepared under its own text, outside pgx's statement cache, which
		// forgets a statement whose execution failed: a refused set fails
		// by design, and the connection's next set would prepare it again,
		// a round trip more, and plan it anew. Not without the cache (the
		// simple protocol behind PgBouncer has no prepared statements).
		if d.prepares {
			if _, err := c.Conn().Prepare(ctx, d.sql.acquireMany, d.sql.acquireMany); err != nil { // once per connection
				return err
			}
		}
		got := 0
		var key string
		var version int64
		rows, _ := c.Query(ctx, d.sql.acquireMany, keys, tokens, owners, us) // its error comes back from ForEachRow
		_, err = pgx.ForEachRow(rows, []any{&key, &version}, func() error {
			if i, ok := at[key]; ok {
				grants[i] = backend.Grant{Fence: uint64(version), TTL: time.Duration(us[i]) * time.Microsecond}
				got++
			}
			return nil
		})
		if code := sqlState(err); d.prepares && (code == codeNoStatement || code == codeChangedResult) {
			// The server forgot it (DISCARD ALL) or cannot run it any more:
			// prepared again next time, as pgx's cache would.
			_ = c.Conn().Deallocate(ctx, d.sql.acquireMany)
		}
		if err == nil && got < n {
			return errSomeHeld
		}
		return err
	})
	switch {
	case err == nil:
		return grants, nil
	case errors.Is(err, errSomeHeld), sqlState(err) == codeDivByZero:
		return nil, fmt.Errorf("sqllock: %w", backend.ErrNotAcquired)
	}
	return nil, d.acquireFailed(err, func(ctx context.Context) { d.ReleaseAll(ctx, claims) })
}

// ReleaseAll implements backend.SetAcquirer with one statement,
// releaseMany, sent once: a claim it did not delete, or every claim when
// it failed, is released alone, which tells not held from cannot tell.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	n := len(claims)
	errs, done := make([]error, n), make([]bool, n)
	keys, tokens, fences, payloads := make([]string, n), make([]string, n), make([]int64, n), make([]string, n)
	at := make(map[string]int, n)
	for i, l := range claims {
		keys[i], tokens[i], fences[i], payloads[i], at[l.Key] = l.Key, l.Token, int64(l.Fence), d.payload(l.Key), i
	}
	if !slices.ContainsFunc(claims, func(l backend.Claim) bool { return l.Mode != backend.Exclusive }) {
		bctx, leave, err := d.begin(ctx, "release", false)
		if err != nil {
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		var key string
		var live bool
		rows, _ := d.pool.Query(bctx, d.sql.releaseMany, keys, tokens, fences, d.sql.channel, payloads) // its error comes back from ForEachRow
		_, err = pgx.ForEachRow(rows, []any{&key, &live, nil}, func() error {
			if i, ok := at[key]; ok {
				done[i] = true
				if !live {
					errs[i] = fmt.Errorf("sqllock: %w: its TTL had run out", backend.ErrNotHeld)
				}
			}
			return nil
		})
		leave()
		if err != nil {
			clear(done)
		}
	}
	// Alone, each claim the statement did not delete: not held or cannot tell.
	for i, l := range claims {
		if !done[i] {
			errs[i] = d.Release(ctx, l)
		}
	}
	return errs
}
