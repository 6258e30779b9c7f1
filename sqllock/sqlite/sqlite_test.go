package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
)

// harness runs the conformance suite on one database file; every driver
// opens it anew, with a pool of its own, as another process would.
type harness struct {
	t     *testing.T
	path  string
	admin *sql.DB
}

func newHarness(t *testing.T) *harness {
	path := filepath.Join(t.TempDir(), "locks.db")
	return &harness{t: t, path: path, admin: adminDB(t, path)}
}

// adminDB is a pool on path for the test's own statements, closed at
// cleanup.
func adminDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn(path, 5000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func (h *harness) url() string { return "sqlite://" + h.path }

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, h.url())
}

// Expire moves the lock's expiry into the past, as its TTL running out
// would.
func (h *harness) Expire(ctx context.Context, key string) error {
	res, err := h.admin.ExecContext(ctx, `UPDATE locker_locks SET expires_us = 0 WHERE name = ?`, key)
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
func (h *harness) Residue(ctx context.Context, key string) (int, error) {
	return h.count(ctx, key, "")
}

// Entries counts the key's live holders and waiting writers.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	return h.count(ctx, key, " AND expires_us > "+now)
}

func (h *harness) count(ctx context.Context, key, cond string) (int, error) {
	var n int
	err := h.admin.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM locker_locks WHERE name = ?1`+cond+
		`) + (SELECT count(*) FROM locker_locks_shared WHERE name = ?1`+cond+`)`, key).Scan(&n)
	return n, err
}

func (h *harness) Traits() conformance.Traits {
	// SQLite's clock ticks in milliseconds, and an expiry is set a tick
	// late (sqldb.SQLite); a release deletes the key's row.
	return conformance.Traits{TTL: 500 * time.Millisecond, Granularity: time.Millisecond, Retention: 0}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

// now is the host's clock in µs, as sqldb.SQLite reads it.
const now = `(CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000)`
