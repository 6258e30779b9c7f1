// Package fencedpgx is package fenced's SQL table guard for pgx users: the
// same table, the same statements, the same errors (fenced.ErrStale,
// fenced.ErrInvalid), on a *pgxpool.Pool or a *pgx.Conn instead of a
// *sql.DB, so that neither kind of user compiles the other's driver.
//
//	g, err := fencedpgx.New(pool)
//	err = g.Tx(ctx, "account/alice", lock.Fence(), func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", amount, "alice")
//		return err
//	})
//	if errors.Is(err, fenced.ErrStale) {
//		// Someone with a later lock has written: this holder's lock is gone.
//	}
//
// A Guard of fenced and one of fencedpgx on the same table guard the same
// resources together.
package fencedpgx

import (
	"context"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/internal/sqlguard"
)

// DB is a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Guard keeps the highest fence each resource has seen, in a table of its
// PostgreSQL database (see CreateTable), and runs writes after a check
// against it.
type Guard struct {
	db DB
	t  sqlguard.Table
}

// New returns the Guard of db's table locker_fences, or of the table
// fenced.WithTable names.
func New(db DB, opts ...fenced.Option) (*Guard, error) {
	if v := reflect.ValueOf(db); db == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("fenced: nil DB: %w", fenced.ErrInvalid)
	}
	t, err := sqlguard.Postgres(sqlguard.TableName(opts))
	if err != nil {
		return nil, err
	}
	return &Guard{db: db, t: t}, nil
}

// CreateTable creates the Guard's table if it does not exist, as
// fenced.Guard.CreateTable does.
func (g *Guard) CreateTable(ctx context.Context) error {
	if _, err := g.db.Exec(ctx, g.t.Create()); err != nil {
		return fmt.Errorf("fenced: create table %s: %w", g.t.Name, err)
	}
	return nil
}

// Tx runs fn in a transaction that first advances resource's fence to
// fence (see Advance), and commits it if fn returns nil. When a higher
// fence was seen, fn does not run and the error wraps fenced.ErrStale.
// fn's error, or a panic, rolls the transaction back.
func (g *Guard) Tx(ctx context.Context, resource string, fence uint64, fn func(pgx.Tx) error) error {
	if err := sqlguard.Check(resource, fence); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, g.db, func(tx pgx.Tx) error {
		if err := g.Advance(ctx, tx, resource, fence); err != nil {
			return err
		}
		return fn(tx)
	})
}

// Advance is the first step of a guarded transaction of the caller's: it
// locks resource's row, and fails with fenced.ErrStale if its fence is
// above fence, else moves it up to fence. Writes that follow in tx, until
// its commit, come before those of any later holder, whose Advance waits
// for the row. Every writer of the resource must go through a guard.
func (g *Guard) Advance(ctx context.Context, tx pgx.Tx, resource string, fence uint64) error {
	return g.t.Advance(ctx, pgxTx{tx}, resource, fence)
}

// pgxTx is a pgx.Tx as sqlguard.Advance uses it.
type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}

func (t pgxTx) QueryInt(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	err := t.tx.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}
