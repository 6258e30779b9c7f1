package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// MySQLURL returns the test server's URL, or skips (fails in CI) when
// the server is not running.
func MySQLURL(t testing.TB) string {
	t.Helper()
	testenv.Require(t, testenv.MySQLAddr())
	return testenv.MySQLURL()
}

// MySQLConfig returns the test server's configuration, placeholders
// filled in by the driver as sqllock/mysql's.
func MySQLConfig(t testing.TB) *gomysql.Config {
	t.Helper()
	u, err := url.Parse(MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, u.Path[1:]
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.InterpolateParams = true
	return cfg
}

// MySQLDB opens cfg's server with a pool of its own, closed at cleanup.
func MySQLDB(t testing.TB, cfg *gomysql.Config) *sql.DB {
	t.Helper()
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// Retention is the tests' WithRetention (retention=): a released lock's
// row stays this long, and goes at the next purge, half of it later.
const Retention = time.Second

// WatcherSite is go-sql-driver's goroutine of one open connection.
const WatcherSite = "go-sql-driver/mysql.(*mysqlConn).startWatcher"

// MySQL is a conformance harness on a table of the test database of its
// own, dropped at cleanup, whose drivers open opens on that table.
type MySQL struct {
	Table string
	Admin *sql.DB // the test's own statements
	open  func(ctx context.Context, table string) (backend.Driver, error)
}

// NewMySQL returns a harness on a fresh table, whose drivers open opens.
func NewMySQL(t testing.TB, open func(ctx context.Context, table string) (backend.Driver, error)) *MySQL {
	admin := MySQLDB(t, MySQLConfig(t))
	table := "locks_" + testutil.RandHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`, `"+table+"_shared`"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return &MySQL{Table: table, Admin: admin, open: open}
}

func (h *MySQL) NewDriver(ctx context.Context) (backend.Driver, error) { return h.open(ctx, h.Table) }

// MySQLNow is the server's clock in µs, as sqldb.MySQL reads it.
const MySQLNow = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// Expire moves the lock's expiry into the past, by the server's clock.
func (h *MySQL) Expire(ctx context.Context, key string) error {
	res, err := h.Admin.ExecContext(ctx, "UPDATE `"+h.Table+"` SET expires_us = "+MySQLNow+" - 1000 WHERE name = ?", key)
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
func (h *MySQL) Entries(ctx context.Context, key string) (int, error) {
	live := " AND expires_us > " + MySQLNow
	n, err := h.count(ctx, h.Table, key, live)
	if err != nil {
		return 0, err
	}
	m, err := h.count(ctx, h.Table+"_shared", key, live+" AND kind > 0")
	return n + m, err
}

// Residue counts the key's rows, live or expired, and the anchors of its
// semaphore and read-write lock.
func (h *MySQL) Residue(ctx context.Context, key string) (int, error) {
	n, err := h.count(ctx, h.Table, key, "")
	if err != nil {
		return 0, err
	}
	m, err := h.count(ctx, h.Table+"_shared", key, "")
	return n + m, err
}

func (h *MySQL) count(ctx context.Context, table, key, cond string) (int, error) {
	var n int
	err := h.Admin.QueryRowContext(ctx, "SELECT count(*) FROM `"+table+"` WHERE name = ?"+cond, key).Scan(&n)
	if err != nil && strings.Contains(err.Error(), "Error 1146") {
		return 0, nil // no such table: no driver made it yet
	}
	return n, err
}

func (h *MySQL) Traits() conformance.Traits {
	// Expiry is exact to the microsecond, on the server's clock; a
	// released lock's row stays for the retention, its semaphore's and
	// read-write lock's go at once. go-sql-driver runs a goroutine per
	// open connection, and the pool keeps up to two idle ones, which a
	// release the Client makes in the background as a cancelled wait
	// returns can open: the pool's, not a leak; Close ends them
	// (sqllock/mysql's TestCloseEndsConnections checks it without this
	// exception).
	return conformance.Traits{TTL: 500 * time.Millisecond, Retention: Retention * 3 / 2, IgnoreGoroutines: []string{WatcherSite}}
}
