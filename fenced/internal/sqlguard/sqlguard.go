// Package sqlguard is the SQL of package fenced's table guard, written once
// for its database/sql Guard and for fencedpgx's: the statements of each
// dialect, the checks of input before any is sent, and the step that
// advances a resource's fence in a transaction.
package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// The errors package fenced exports.
var (
	ErrStale   = errors.New("stale fence")
	ErrInvalid = errors.New("invalid input")
)

// MaxResourceLen is the longest resource name, in bytes.
const MaxResourceLen = 255

// Option configures a guard of either driver: package fenced's Option.
type Option func(table *string)

// TableName is the table opts name, locker_fences by default.
func TableName(opts []Option) string {
	name := "locker_fences"
	for _, o := range opts {
		o(&name)
	}
	return name
}

// Table is a guard's table and its statements in one dialect.
type Table struct {
	Name                string
	ensure, read, write string
}

// Postgres is table in PostgreSQL.
func Postgres(table string) (Table, error) {
	return statements(table,
		"INSERT INTO %s (resource, fence) VALUES ($1, 0) ON CONFLICT (resource) DO NOTHING",
		"SELECT fence FROM %s WHERE resource = $1 FOR UPDATE",
		"UPDATE %s SET fence = $1 WHERE resource = $2")
}

// MySQL is table in MySQL and MariaDB.
func MySQL(table string) (Table, error) {
	// Not INSERT IGNORE: on an existing row it takes a shared lock, which
	// two writers' locking reads then both wait to upgrade.
	return statements(table,
		"INSERT INTO %s (resource, fence) VALUES (?, 0) ON DUPLICATE KEY UPDATE fence = fence",
		"SELECT fence FROM %s WHERE resource = ? FOR UPDATE",
		"UPDATE %s SET fence = ? WHERE resource = ?")
}

// SQLite is table in SQLite.
func SQLite(table string) (Table, error) {
	// The insert, a write even when it inserts nothing, takes the
	// database's one write lock for the transaction: the read after it is
	// as good as a locking read.
	return statements(table,
		"INSERT OR IGNORE INTO %s (resource, fence) VALUES (?, 0)",
		"SELECT fence FROM %s WHERE resource = ?",
		"UPDATE %s SET fence = ? WHERE resource = ?")
}

func statements(table, ensure, read, write string) (Table, error) {
	if !identifier(table) {
		return Table{}, fmt.Errorf("fenced: table %q: want letters, digits and _, not first a digit, at most 63, with one optional schema.: %w", table, ErrInvalid)
	}
	return Table{Name: table, ensure: fmt.Sprintf(ensure, table), read: fmt.Sprintf(read, table), write: fmt.Sprintf(write, table)}, nil
}

// Create is the statement that creates the table if it does not exist.
func (t Table) Create() string {
	return "CREATE TABLE IF NOT EXISTS " + t.Name + " (resource VARCHAR(255) PRIMARY KEY, fence BIGINT NOT NULL)"
}

// Tx is what Advance needs of a transaction of either driver.
type Tx interface {
	Exec(ctx context.Context, query string, args ...any) error
	QueryInt(ctx context.Context, query string, args ...any) (int64, error)
}

// Advance locks resource's row in tx, and fails with ErrStale if its fence
// is above fence, else moves it up to fence.
func (t Table) Advance(ctx context.Context, tx Tx, resource string, fence uint64) error {
	if err := Check(resource, fence); err != nil {
		return err
	}
	if err := tx.Exec(ctx, t.ensure, resource); err != nil {
		return fmt.Errorf("fenced: %q: %w", resource, err)
	}
	seen, err := tx.QueryInt(ctx, t.read, resource)
	if err != nil {
		return fmt.Errorf("fenced: %q: %w", resource, err)
	}
	switch f := int64(fence); {
	case seen > f:
		return fmt.Errorf("fenced: %q: fence %d is below %d, a later holder's: %w", resource, fence, seen, ErrStale)
	case seen < f:
		if err := tx.Exec(ctx, t.write, f, resource); err != nil {
			return fmt.Errorf("fenced: %q: %w", resource, err)
		}
	}
	return nil
}

// Check refuses what no statement should be sent for.
func Check(resource string, fence uint64) error {
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
