package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// sqliteOwned is a driver on a *sql.DB of the test's, as a user of New
// has it: Close closes the *sql.DB after the driver.
type sqliteOwned struct {
	*Driver
	db *sql.DB
}

func (d sqliteOwned) Close() error {
	err := d.Driver.Close()
	d.db.Close()
	return err
}

// The suite through New, each driver on a *sql.DB of its own on one file.
func TestSQLiteConformance(t *testing.T) {
	conformance.Run(t, sqltest.NewSQLite(t, func(ctx context.Context, path string) (backend.Driver, error) {
		db := sqltest.SQLiteDB(t, path)
		d, err := New(db, SQLite)
		if err != nil {
			return nil, err
		}
		return sqliteOwned{d, db}, nil
	}))
}

// sqliteDriver is New on a fresh file, closed at cleanup, and its path.
func sqliteDriver(t *testing.T) (*Driver, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "locks.db")
	d, err := New(sqltest.SQLiteDB(t, path), SQLite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

// Fences grow across release, expiry takeover, Break, and a restart of
// every process (all connections closed, the file opened again): they
// come from AUTOINCREMENT, whose high mark outlives the rows.
func TestSQLiteFencesGrow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, path := sqliteDriver(t)
	var last uint64
	grant := func(d *Driver, what string) backend.Claim {
		t.Helper()
		c := backend.Claim{Key: "ns/f", Token: testutil.Token(), TTL: time.Minute}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", what, err)
		}
		if g.Fence <= last {
			t.Fatalf("%s: fence %d after %d", what, g.Fence, last)
		}
		last, c.Fence = g.Fence, g.Fence
		return c
	}
	c := grant(d, "first")
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	c = grant(d, "after a release")
	if _, err := d.db.ExecContext(ctx, `UPDATE locker_locks SET expires_us = 0 WHERE name = ?`, c.Key); err != nil {
		t.Fatal(err)
	}
	c = grant(d, "after expiry")
	if _, err := d.Break(ctx, c.Key, backend.Exclusive, c.Fence); err != nil {
		t.Fatal(err)
	}
	c = grant(d, "after Break")
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d.db.Close()
	d2, err := New(sqltest.SQLiteDB(t, path), SQLite)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	grant(d2, "after a restart")
}

// A lock lives its TTL by the host's clock, to the millisecond SQLite
// reads: not free a moment before, free soon after.
func TestSQLiteExpiryOnTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, _ := sqliteDriver(t)
	const ttl = 300 * time.Millisecond
	sent := time.Now()
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/e", Token: testutil.Token(), TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	other := backend.Claim{Key: "ns/e", Token: testutil.Token(), TTL: time.Minute}
	for i := 0; ; i++ {
		_, err := d.TryAcquire(ctx, other)
		now := time.Now()
		if err == nil {
			if now.Before(sent.Add(ttl)) {
				t.Fatalf("taken over %v after the request: before the %v TTL", now.Sub(sent), ttl)
			}
			if now.After(sent.Add(ttl + 200*time.Millisecond)) {
				t.Fatalf("taken over %v after the request: long after the %v TTL", now.Sub(sent), ttl)
			}
			return
		}
		if !errors.Is(err, backend.ErrNotAcquired) || i > 1000 {
			t.Fatalf("TryAcquire %d: %v", i, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// The error texts of SQLite that the dialect reads, as drivers write them.
func TestSQLiteClassify(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]errKind{
		"constraint failed: UNIQUE constraint failed: locker_locks.name (2067)": errDuplicate, // modernc
		"UNIQUE constraint failed: locker_locks.name":                           errDuplicate, // mattn
		"database is locked (5) (SQLITE_BUSY)":                                  errBusy,
		"sqlite3: database is locked":                                           errBusy, // ncruces
		"database table is locked":                                              errBusy,
		"SQL logic error: no such table: locker_locks (1)":                      errNoTable,
		"attempt to write a readonly database (8)":                              errPermission,
		"attempt to write a readonly database (1544)":                           errPermission,
		"unable to open database file (14)":                                     errOther,
		"disk I/O error (10)":                                                   errOther,
	} {
		if got := sqliteClassify(errors.New(msg)); got != want {
			t.Errorf("sqliteClassify(%q) = %d, want %d", msg, got, want)
		}
	}
}

// Table names are quoted, whatever they hold; SQLite's own are refused.
func TestSQLiteTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.SQLiteDB(t, filepath.Join(t.TempDir(), "locks.db"))
	for _, name := range []string{`my "locks"`, "ü; DROP TABLE x; --"} {
		d, err := New(db, SQLite, WithTable(name))
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/t", Token: testutil.Token(), TTL: time.Minute}); err != nil {
			t.Fatalf("TryAcquire in table %q: %v", name, err)
		}
		d.Close()
	}
	for _, name := range []string{"", "sqlite_master", "x\ny"} {
		if _, err := New(db, SQLite, WithTable(name)); !errors.Is(err, backend.ErrInvalidOption) {
			t.Errorf("New(%q) = %v, want ErrInvalidOption", name, err)
		}
	}
}

// List pages through the live rows under a prefix in the names' byte
// order; the upper bound, a []byte, compares with the TEXT names.
func TestSQLiteList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, _ := sqliteDriver(t)
	var want []string
	for i := range listPage + 5 {
		want = append(want, fmt.Sprintf("ns/p/%05d", i))
	}
	want = append(want, "ns/p/é", "ns/p/\U0001F512")
	for _, key := range append(slices.Clone(want), "ns/p", "ns/q/0", "ns/o/9") {
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: testutil.Token(), TTL: time.Minute}); err != nil {
			t.Fatalf("TryAcquire %q: %v", key, err)
		}
	}
	got, err := d.List(ctx, "ns/p/", backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("List = %d locks, want %d", len(got), len(want))
	}
	for i, st := range got {
		if st.Key != want[i] || !st.Held || st.Fence == 0 || st.TTL <= 0 || st.TTL > time.Minute+time.Millisecond {
			t.Fatalf("List[%d] = %+v, want %q held, with a fence and at most 1m1ms left", i, st, want[i])
		}
	}
}

// RefreshMany extends the claims still held and reports the others lost.
func TestSQLiteRefreshMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, _ := sqliteDriver(t)
	var claims []backend.Claim
	for _, key := range []string{"ns/r1", "ns/r2", "ns/r3"} {
		c := backend.Claim{Key: key, Token: testutil.Token(), TTL: time.Minute, Owner: "o"}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		claims = append(claims, c)
	}
	claims[1].Token = testutil.Token() // another token
	if _, err := d.db.ExecContext(ctx, `UPDATE locker_locks SET expires_us = 0 WHERE name = ?`, claims[2].Key); err != nil {
		t.Fatal(err)
	}
	claims[0].TTL = 2 * time.Minute
	errs := d.RefreshMany(ctx, claims)
	if errs[0] != nil || !errors.Is(errs[1], backend.ErrNotHeld) || !errors.Is(errs[2], backend.ErrNotHeld) {
		t.Fatalf("RefreshMany = %v, want [nil, ErrNotHeld, ErrNotHeld]", errs)
	}
	st, err := d.Inspect(ctx, claims[0].Key, backend.Exclusive)
	if err != nil || st.TTL <= time.Minute {
		t.Fatalf("Inspect after RefreshMany = %+v, %v: want more than 1m left", st, err)
	}
}

// An acquisition whose context ends as it runs leaves no row once it has
// returned, even when its INSERT committed before the driver noticed (the
// driver then returns the context's error all the same).
func TestSQLiteCancelledAcquireLeavesNothing(t *testing.T) {
	t.Parallel()
	d, _ := sqliteDriver(t)
	if _, err := d.Inspect(context.Background(), "ns/c", backend.Exclusive); err != nil { // makes the table
		t.Fatal(err)
	}
	cancelled := 0
	for i := range 300 {
		c := backend.Claim{Key: "ns/c", Token: testutil.Token(), TTL: time.Minute}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*2*time.Microsecond)
		g, err := d.TryAcquire(ctx, c)
		cancel()
		if err == nil {
			c.Fence = g.Fence
			if err := d.Release(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			continue
		}
		cancelled++
		var n int
		if err := d.db.QueryRow(`SELECT count(*) FROM locker_locks WHERE name = ?`, c.Key).Scan(&n); err != nil || n != 0 {
			t.Fatalf("after a cancelled TryAcquire (%d µs): %d rows, %v", 2*i, n, err)
		}
	}
	t.Logf("%d of 300 acquisitions cancelled", cancelled)
}

// SchemaSQL, run by a migration, makes tables that a driver with
// WithCreateTable(false) uses for every mode.
func TestSQLiteSchemaSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locks.db")
	db := sqltest.SQLiteDB(t, path)
	if _, err := db.ExecContext(ctx, SQLite.SchemaSQL()); err != nil {
		t.Fatalf("SchemaSQL: %v\n%s", err, SQLite.SchemaSQL())
	}
	d, err := Open(ctx, sqltest.SQLiteDB(t, path), SQLite, WithCreateTable(false))
	if err != nil {
		t.Fatalf("Open with create_table=false on SchemaSQL's tables: %v", err)
	}
	defer d.Close()
	for _, m := range []backend.Mode{backend.Exclusive, backend.Permit, backend.Read, backend.Write} {
		c := backend.Claim{Key: "ns/m", Token: testutil.Token(), TTL: time.Minute, Mode: m}
		if m == backend.Permit {
			c.Limit = 2
		}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatalf("TryAcquire %v: %v", m, err)
		}
		c.Fence = g.Fence
		if err := d.Release(ctx, c); err != nil {
			t.Fatalf("Release %v: %v", m, err)
		}
	}
}

// Drivers on pools of their own, as processes would be, whose first calls
// open a new file at once all succeed: the connections that lose the race
// to switch it to WAL, which SQLite answers with SQLITE_BUSY at once
// (without the busy handler), try again. Each round opens a new file; a
// loss came about once in a hundred opens.
func TestSQLiteNewFileAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for round := range 100 {
		path := filepath.Join(t.TempDir(), "locks.db")
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range errs {
			db := sqltest.SQLiteDB(t, path)
			d, err := New(db, SQLite)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				defer db.Close()
				defer d.Close()
				_, errs[i] = d.TryAcquire(ctx, backend.Claim{Key: fmt.Sprintf("ns/%d", i), Token: testutil.Token(), TTL: time.Minute})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, driver %d: TryAcquire on a new file: %v", round, i, err)
			}
		}
	}
}
