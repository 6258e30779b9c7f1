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

// errSomeHeld: acquireMany returned no row, or had to undo itself.
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
		got := 0
		var key string
		var version int64
		rows, _ := d.pool.Query(ctx, d.sql.acquireMany, keys, tokens, owners, us, int64(n)) // its error comes back from ForEachRow
		_, err := pgx.ForEachRow(rows, []any{&key, &version, nil}, func() error {
			if i, ok := at[key]; ok {
				grants[i] = backend.Grant{Fence: uint64(version), TTL: time.Duration(us[i]) * time.Microsecond}
				got++
			}
			return nil
		})
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
