package fenced

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/lockerhq/locker/fenced/internal/sqlguard"
)

// ErrStale is wrapped by the error of a write whose fence is below one the
// resource has seen: a later holder of the lock has written.
var ErrStale = sqlguard.ErrStale

// ErrInvalid is wrapped by the errors of bad input, returned before any
// statement is sent.
var ErrInvalid = sqlguard.ErrInvalid

// MaxResourceLen is the longest resource name, in bytes.
const MaxResourceLen = sqlguard.MaxResourceLen

// Dialect is the SQL dialect of a Guard's database.
type Dialect int

const (
	Postgres Dialect = iota + 1 // PostgreSQL, through any database/sql driver (pgx's stdlib, lib/pq)
	MySQL                       // MySQL and MariaDB
	SQLite                      // SQLite
)

// Guard keeps the highest fence each resource has seen, in a table of its
// database (see CreateTable), and runs writes after a check against it.
type Guard struct {
	db *sql.DB
	t  sqlguard.Table
}

// New returns the Guard of db's table locker_fences, or of the table
// WithTable names.
func New(db *sql.DB, d Dialect, opts ...Option) (*Guard, error) {
	if db == nil {
		return nil, fmt.Errorf("fenced: nil *sql.DB: %w", ErrInvalid)
	}
	g := &Guard{db: db}
	table := sqlguard.TableName(opts)
	var err error
	switch d {
	case Postgres:
		g.t, err = sqlguard.Postgres(table)
	case MySQL:
		g.t, err = sqlguard.MySQL(table)
	case SQLite:
		g.t, err = sqlguard.SQLite(table)
	default:
		err = fmt.Errorf("fenced: dialect %d: want Postgres, MySQL or SQLite: %w", d, ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Option configures a Guard, of this package or of fencedpgx.
type Option = sqlguard.Option

// WithTable names the Guard's table (default locker_fences), optionally
// schema-qualified.
func WithTable(name string) Option { return func(t *string) { *t = name } }

// CreateTable creates the Guard's table if it does not exist:
//
//	CREATE TABLE IF NOT EXISTS locker_fences (resource VARCHAR(255) PRIMARY KEY, fence BIGINT NOT NULL)
//
// Run it once, with a role that may create tables; the Guard itself needs
// SELECT, INSERT and UPDATE on it.
func (g *Guard) CreateTable(ctx context.Context) error {
	if _, err := g.db.ExecContext(ctx, g.t.Create()); err != nil {
		return fmt.Errorf("fenced: create table %s: %w", g.t.Name, err)
	}
	return nil
}

// Tx runs fn in a transaction of the Guard's database that first advances
// resource's fence to fence (see Advance), and commits it if fn returns
// nil. When a higher fence was seen, fn does not run and the error wraps
// ErrStale. fn's error, or a panic, rolls the transaction back.
func (g *Guard) Tx(ctx context.Context, resource string, fence uint64, fn func(*sql.Tx) error) error {
	if err := sqlguard.Check(resource, fence); err != nil {
		return err
	}
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fenced: %q: begin: %w", resource, err)
	}
	committed := false
	defer func() {
		if !committed {
			tx.Rollback()
		}
	}()
	if err := g.Advance(ctx, tx, resource, fence); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fenced: %q: commit: %w", resource, err)
	}
	return nil
}

// Advance is the first step of a guarded transaction of the caller's: it
// locks resource's row, and fails with ErrStale if its fence is above
// fence, else moves it up to fence. Writes that follow in tx, until its
// commit, come before those of any later holder, whose Advance waits for
// the row. Every writer of the resource must go through the Guard.
func (g *Guard) Advance(ctx context.Context, tx *sql.Tx, resource string, fence uint64) error {
	return g.t.Advance(ctx, sqlTx{tx}, resource, fence)
}

// sqlTx is a *sql.Tx as sqlguard.Advance uses it.
type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, q, args...)
	return err
}

func (t sqlTx) QueryInt(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	err := t.tx.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}
