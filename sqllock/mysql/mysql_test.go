package mysql

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// baseURL returns the test server's URL (LOCKER_MYSQL_URL), or skips
// (fails with LOCKER_REQUIRE_SERVERS=1) when it is unset or unreachable.
// The one place to switch to testenv.MySQLURL once it exists.
func baseURL(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("LOCKER_MYSQL_URL")
	if raw == "" {
		if os.Getenv("LOCKER_REQUIRE_SERVERS") == "1" || os.Getenv("CI") != "" {
			t.Fatal("LOCKER_MYSQL_URL is not set")
		}
		t.Skip("LOCKER_MYSQL_URL is not set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("LOCKER_MYSQL_URL: %v", err)
	}
	testenv.Require(t, u.Host)
	return raw
}

var randHex = testutil.RandHex

// withParams adds query parameters to a URL.
func withParams(t testing.TB, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// adminDB opens the test server for the test's own statements.
func adminDB(t testing.TB) *sql.DB {
	t.Helper()
	u, err := url.Parse(baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// harness runs the conformance suite on one table of the test database,
// with drivers from Open (the URL), or from sqldb.New on a *sql.DB made
// from a DSN with go-sql-driver's defaults (prepared statements).
type harness struct {
	t      *testing.T
	url    string // with lock_table
	table  string
	admin  *sql.DB
	viaNew bool
}

func newHarness(t *testing.T, viaNew bool) *harness {
	admin := adminDB(t)
	table := "locks_" + randHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`, `"+table+"_shared`"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return &harness{t: t, url: withParams(t, baseURL(t), "lock_table", table), table: table, admin: admin, viaNew: viaNew}
}

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	if !h.viaNew {
		return Open(ctx, h.url)
	}
	u, err := url.Parse(h.url)
	if err != nil {
		return nil, err
	}
	cfg, _, err := config(u)
	if err != nil {
		return nil, err
	}
	cfg.InterpolateParams = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	eng, err := sqldb.New(db, sqldb.MySQL, sqldb.WithTable(h.table))
	if err != nil {
		db.Close()
		return nil, err
	}
	return &userDB{Driver: eng, db: db}, nil
}

// userDB is the engine on a user's *sql.DB, which the user closes after
// the driver.
type userDB struct {
	*sqldb.Driver
	db *sql.DB
}

func (u *userDB) Close() error {
	err := u.Driver.Close()
	u.db.Close()
	return err
}

const now = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// Expire moves the lock's expiry into the past, by the server's clock.
func (h *harness) Expire(ctx context.Context, key string) error {
	res, err := h.admin.ExecContext(ctx, "UPDATE `"+h.table+"` SET expires_us = "+now+" - 1000 WHERE name = ?", key)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errors.New("no lock to expire on " + key)
	}
	return nil
}

// Entries counts the live holders of key: of its lock, its semaphore and
// its read-write lock (and a waiting writer's record).
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	live := " AND expires_us > " + now
	n, err := h.count(ctx, h.table, key, live)
	if err != nil {
		return 0, err
	}
	m, err := h.count(ctx, h.table+"_shared", key, live+" AND kind > 0")
	return n + m, err
}

// Residue counts the key's rows, live or expired, and the anchors of its
// semaphore and read-write lock.
func (h *harness) Residue(ctx context.Context, key string) (int, error) {
	n, err := h.count(ctx, h.table, key, "")
	if err != nil {
		return 0, err
	}
	m, err := h.count(ctx, h.table+"_shared", key, "")
	return n + m, err
}

func (h *harness) count(ctx context.Context, table, key, cond string) (int, error) {
	var n int
	err := h.admin.QueryRowContext(ctx, "SELECT count(*) FROM `"+table+"` WHERE name = ?"+cond, key).Scan(&n)
	if isNoTable(err) {
		return 0, nil // no driver made it yet
	}
	return n, err
}

func isNoTable(err error) bool { return err != nil && strings.Contains(err.Error(), "Error 1146") }

// NewCutDriver opens a driver that dials the server through a proxy of
// its own, the switch.
func (h *harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	u, err := url.Parse(h.url)
	if err != nil {
		return nil, nil, err
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		return nil, nil, err
	}
	h.t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	d, err := Open(ctx, u.String())
	if err != nil {
		return nil, nil, err
	}
	return d, func(on bool) {
		p.Refuse(on)
		if on {
			p.Cut()
		}
	}, nil
}

func (h *harness) Traits() conformance.Traits {
	// Expiry is exact to the microsecond, on the server's clock; a
	// release deletes the key's row. go-sql-driver runs a goroutine per
	// open connection, and the pool keeps up to two idle ones, which a
	// release the Client makes in the background as a cancelled wait
	// returns can open: the pool's, not a leak; Close ends them
	// (TestCloseEndsConnections checks it without this exception).
	return conformance.Traits{TTL: 500 * time.Millisecond, IgnoreGoroutines: []string{watcherSite}}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t, false))
}

// The engine on a *sql.DB of the user's, with prepared statements.
func TestConformanceNew(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole suite again")
	}
	conformance.Run(t, newHarness(t, true))
}

// watcherSite is go-sql-driver's goroutine of one open connection.
const watcherSite = "go-sql-driver/mysql.(*mysqlConn).startWatcher"
