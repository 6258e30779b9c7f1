package fenced

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// ErrStale is wrapped by the error of a write whose fence is below one the
// resource has seen: a later holder of the lock has written.
var ErrStale = errors.New("stale fence")

// ErrInvalid is wrapped by the errors of bad input, returned before any
// statement is sent.
var ErrInvalid = errors.New("invalid input")

// MaxResourceLen is the longest resource name, in bytes.
const MaxResourceLen = 255

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
	db    *sql.DB
	d     Dialect
	table string
	// The statements, in the dialect.
	ensure, read, write string
}

// New returns the Guard of db's table locker_fences, or of the table
// WithTable names.
func New(db *sql.DB, d Dialect, opts ...Option) (*Guard, error) {
	if db == nil {
		return nil, fmt.Errorf("fenced: nil *sql.DB: %w", ErrInvalid)
	}
	g := &Guard{db: db, d: d, table: "locker_fences"}
	for _, o := range opts {
		o(g)
	}
	if !identifier(g.table) {
		return nil, fmt.Errorf("fenced: table %q: want letters, digits and _, not first a digit, at most 63, with one optional schema.: %w", g.table, ErrInvalid)
	}
	t := g.table
	switch d {
	case Postgres:
		g.ensure = "INSERT INTO " + t + " (resource, fence) VALUES ($1, 0) ON CONFLICT (resource) DO NOTHING"
		g.read = "SELECT fence FROM " + t + " WHERE resource = $1 FOR UPDATE"
		g.write = "UPDATE " + t + " SET fence = $1 WHERE resource = $2"
	case MySQL:
		// Not INSERT IGNORE: on an existing row it takes a shared lock,
		// which two writers' locking reads then both wait to upgrade.
		g.ensure = "INSERT INTO " + t + " (resource, fence) VALUES (?, 0) ON DUPLICATE KEY UPDATE fence = fence"
		g.read = "SELECT fence FROM " + t + " WHERE resource = ? FOR UPDATE"
		g.write = "UPDATE " + t + " SET fence = ? WHERE resource = ?"
	case SQLite:
		// The insert, a write even when it inserts nothing, takes the
		// database's one write lock for the transaction: the read after
		// it is as good as a locking read.
		g.ensure = "INSERT OR IGNORE INTO " + t + " (resource, fence) VALUES (?, 0)"
		g.read = "SELECT fence FROM " + t + " WHERE resource = ?"
		g.write = "UPDATE " + t + " SET fence = ? WHERE resource = ?"
	default:
		return nil, fmt.Errorf("fenced: dialect %d: want Postgres, MySQL or SQLite: %w", d, ErrInvalid)
	}
	return g, nil
}

// Option configures a Guard.
type Option func(*Guard)

// WithTable names the Guard's table (default locker_fences), optionally
// schema-qualified.
func WithTable(name string) Option { return func(g *Guard) { g.table = name } }

// CreateTable creates the Guard's table if it does not exist:
//
//	CREATE TABLE IF NOT EXISTS locker_fences (resource VARCHAR(255) PRIMARY KEY, fence BIGINT NOT NULL)
//
// Run it once, with a role that may create tables; the Guard itself needs
// SELECT, INSERT and UPDATE on it.
func (g *Guard) CreateTable(ctx context.Context) error {
	_, err := g.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+g.table+" (resource VARCHAR(255) PRIMARY KEY, fence BIGINT NOT NULL)")
	if err != nil {
		return fmt.Errorf("fenced: create table %s: %w", g.table, err)
	}
	return nil
}

// Tx runs fn in a transaction of the Guard's database that first advances
// resource's fence to fence (see Advance), and commits it if fn returns
// nil. When a higher fence was seen, fn does not run and the error wraps
// ErrStale. fn's error, or a panic, rolls the transaction back.
func (g *Guard) Tx(ctx context.Context, resource string, fence uint64, fn func(*sql.Tx) error) error {
	if err := check(resource, fence); err != nil {
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
	if err := check(resource, fence); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, g.ensure, resource); err != nil {
		return fmt.Errorf("fenced: %q: %w", resource, err)
	}
	var seen int64
	if err := tx.QueryRowContext(ctx, g.read, resource).Scan(&seen); err != nil {
		return fmt.Errorf("fenced: %q: %w", resource, err)
	}
	switch f := int64(fence); {
	case seen > f:
		return fmt.Errorf("fenced: %q: fence %d is below %d, a later holder's: %w", resource, fence, seen, ErrStale)
	case seen < f:
		if _, err := tx.ExecContext(ctx, g.write, f, resource); err != nil {
			return fmt.Errorf("fenced: %q: %w", resource, err)
		}
	}
	return nil
}

// check refuses what no statement should be sent for.
func check(resource string, fence uint64) error {
	switch {
	case resource == "" || len(resource) > MaxResourceLen || !utf8.ValidString(resource):
		return fmt.Errorf("fenced: resource %q: want 1 to %d bytes of UTF-8: %w", resource, MaxResourceLen, ErrInvalid)
	case fence == 0:
		return fmt.Errorf("fenced: %q: fence 0: the lock's backend issues no fences: %w", resource, ErrInvalid)
	case fence > math.MaxInt64:
		return fmt.Errorf("fenced: %q: fence %d is above a BIGINT's range: %w", resource, fence, ErrInvalid)
	}
	return nil
}

// identifier reports whether name is a plain SQL identifier, optionally
// schema-qualified.
func identifier(name string) bool {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 || p[0] >= '0' && p[0] <= '9' {
			return false
		}
		for _, r := range p {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return false
			}
		}
	}
	return true
}
