package sqllock

import (
	"context"
	"errors"
	"fmt"
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
		rows, err := d.pool.Query(ctx, d.sql.acquireMany, keys, tokens, owners, us, int64(n))
		if err != nil {
			return err
		}
		got := 0
		for rows.Next() {
			var key string
			var version int64
			if err := rows.Scan(&key, &version, nil); err != nil {
				rows.Close()
				return err
			}
			if i, ok := at[key]; ok {
				grants[i] = backend.Grant{Fence: uint64(version), TTL: time.Duration(us[i]) * time.Microsecond}
				got++
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if got < n {
			return errSomeHeld
		}
		return nil
	})
	switch {
	case err == nil:
		return grants, nil
	case errors.Is(err, errSomeHeld), sqlState(err) == codeDivByZero:
		return nil, fmt.Errorf("sqllock: %w", backend.ErrNotAcquired)
	}
	return nil, d.acquireFailed(err, func(ctx context.Context) { d.ReleaseAll(ctx, claims) })
}

// ReleaseAll implements backend.SetAcquirer: the release statement of
// each claim, sent together in one round trip (a pgx batch), each its own
// transaction; a claim whose answer the batch lost is released alone.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	var b pgx.Batch
	for _, l := range claims {
		if l.Mode != backend.Exclusive {
			for i, l := range claims {
				errs[i] = d.Release(ctx, l)
			}
			return errs
		}
		b.Queue(d.sql.release, l.Key, l.Token, int64(l.Fence), d.sql.channel, d.payload(l.Key))
	}
	bctx, leave, err := d.begin(ctx, "release", false)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	br := d.pool.SendBatch(bctx, &b)
	answered := make([]bool, len(claims))
	for i := range claims {
		var live bool
		err := br.QueryRow().Scan(&live, nil)
		switch {
		case err == nil && live:
			answered[i] = true
		case err == nil:
			answered[i], errs[i] = true, fmt.Errorf("sqllock: %w: its TTL had run out", backend.ErrNotHeld)
		case errors.Is(err, pgx.ErrNoRows):
			answered[i], errs[i] = true, fmt.Errorf("sqllock: %w", backend.ErrNotHeld)
		}
	}
	br.Close()
	leave()
	for i, l := range claims {
		if !answered[i] {
			errs[i] = d.Release(ctx, l)
		}
	}
	return errs
}
