package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the driver sqllock/sqlite opens

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
)

// SQLiteDB opens path as sqllock/sqlite does (WAL, a 5 s busy timeout, 8 idle connections),
// with a pool of its own; closed at cleanup, if not before.
func SQLiteDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file://"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(8) // as sqllock/sqlite opens it
	t.Cleanup(func() { db.Close() })
	return db
}

// SQLite is a conformance harness on one database file of the test's;
// every driver opens it anew, with a pool of its own, as another process
// would.
type SQLite struct {
	Path  string
	Admin *sql.DB // the test's own statements
	open  func(ctx context.Context, path string) (backend.Driver, error)
}

// NewSQLite returns a harness on a fresh file, whose drivers open opens.
func NewSQLite(t testing.TB, open func(ctx context.Context, path string) (backend.Driver, error)) *SQLite {
	path := filepath.Join(t.TempDir(), "locks.db")
	return &SQLite{Path: path, Admin: SQLiteDB(t, path), open: open}
}

func (h *SQLite) NewDriver(ctx context.Context) (backend.Driver, error) { return h.open(ctx, h.Path) }

// Expire moves the lock's expiry into the past, as its TTL running out
// would.
func (h *SQLite) Expire(ctx context.Context, key string) error {
	res, err := h.Admin.ExecContext(ctx, `UPDATE locker_locks SET expires_us = 0 WHERE name = ?`, key)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return errors.New("no lock to expire on " + key)
	}
	return nil
}

// Residue counts the key's rows in both tables: its lock's, and its
// semaphore's and read-write lock's (holders, waiting writers, anchors).
// The fence counters are the tables', in sqlite_sequence.
func (h *SQLite) Residue(ctx context.Context, key string) (int, error) {
	return h.count(ctx, key, "")
}

// Entries counts the key's live holders and waiting writers.
func (h *SQLite) Entries(ctx context.Context, key string) (int, error) {
	return h.count(ctx, key, " AND expires_us > "+sqliteNow)
}

func (h *SQLite) count(ctx context.Context, key, cond string) (int, error) {
	var n int
	err := h.Admin.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM locker_locks WHERE name = ?1`+cond+
		`) + (SELECT count(*) FROM locker_locks_shared WHERE name = ?1`+cond+`)`, key).Scan(&n)
	return n, err
}

func (h *SQLite) Traits() conformance.Traits {
	// SQLite's clock ticks in milliseconds, and an expiry is set a tick
	// late (sqldb.SQLite); a release deletes the key's row.
	return conformance.Traits{TTL: 500 * time.Millisecond, Granularity: time.Millisecond}
}

// sqliteNow is the host's clock in µs, as sqldb.SQLite reads it.
const sqliteNow = `(CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000)`
