package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// baseURL returns the test server's URL, or skips (fails in CI) when the
// server is not running.
func baseURL(t testing.TB) string {
	t.Helper()
	testenv.Require(t, testenv.MySQLAddr())
	return testenv.MySQLURL()
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
	return &harness{t: t, url: withParams(t, baseURL(t), "lock_table", table, "retention", retention.String()), table: table, admin: admin, viaNew: viaNew}
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
	eng, err := sqldb.New(db, sqldb.MySQL, sqldb.WithTable(h.table), sqldb.WithRetention(retention))
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
	// released lock's row stays for the retention, its semaphore's and
	// read-write lock's go at once. go-sql-driver runs a goroutine per
	// open connection, and the pool keeps up to two idle ones, which a
	// release the Client makes in the background as a cancelled wait
	// returns can open: the pool's, not a leak; Close ends them
	// (TestCloseEndsConnections checks it without this exception).
	return conformance.Traits{TTL: 500 * time.Millisecond, Retention: retention * 3 / 2, IgnoreGoroutines: []string{watcherSite}}
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

// retention is the tests' WithRetention: a released lock's row (its
// fence) stays this long, and goes at the next purge, half of it later.
const retention = time.Second

// watcherSite is go-sql-driver's goroutine of one open connection.
const watcherSite = "go-sql-driver/mysql.(*mysqlConn).startWatcher"

// The suite skips the modes a driver does not take: make sure it runs
// them on MySQL.
func TestTakesEveryMode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, newHarness(t, false).url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if want := backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write); d.Modes() != want {
		t.Fatalf("Modes() = %v, want %v", d.Modes(), want)
	}
}

// Close ends every connection Open made, and so each one's goroutine,
// which the conformance harness's leak checks pass over.
func TestCloseEndsConnections(t *testing.T) {
	h := newHarness(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := watchers()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 { // concurrent calls: several connections
		wg.Go(func() {
			c := backend.Claim{Key: fmt.Sprintf("close/%d", i), Token: randHex(16), TTL: time.Minute}
			if g, err := d.TryAcquire(ctx, c); err == nil {
				c.Fence = g.Fence
				d.Release(ctx, c)
			}
		})
	}
	wg.Wait()
	if watchers() <= before {
		t.Fatal("no connection goroutine while the driver is open: the check below checks nothing")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); watchers() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connection goroutines after Close, %d before Open", watchers(), before)
		}
	}
}

// watchers counts go-sql-driver's connection goroutines.
func watchers() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), watcherSite+".func1()")
}

// On a blackholed connection (no answer, no reset), every call returns
// within CancelGrace of its context's end, and Close within 2 s.
func TestBlackholedCallsReturn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	d, err := Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	held := backend.Claim{Key: "bh/held", Token: randHex(16), TTL: time.Minute}
	g, err := d.TryAcquire(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	held.Fence = g.Fence
	p.Blackhole()
	const wait = 100 * time.Millisecond
	calls := map[string]func(context.Context) error{
		"TryAcquire": func(ctx context.Context) error {
			_, err := d.TryAcquire(ctx, backend.Claim{Key: "bh/x", Token: randHex(16), TTL: time.Minute})
			return err
		},
		"TryAcquire permit": func(ctx context.Context) error {
			_, err := d.TryAcquire(ctx, backend.Claim{Key: "bh/s", Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: 2})
			return err
		},
		"Refresh": func(ctx context.Context) error { return d.Refresh(ctx, held) },
		"Release": func(ctx context.Context) error { return d.Release(ctx, held) },
		"Inspect": func(ctx context.Context) error { _, err := d.Inspect(ctx, held.Key); return err },
	}
	for name, call := range calls {
		cctx, ccancel := context.WithTimeout(ctx, wait)
		start := time.Now()
		err := call(cctx)
		took := time.Since(start)
		ccancel()
		if err == nil {
			t.Errorf("%s on a blackholed connection succeeded", name)
		}
		if took > wait+backend.CancelGrace {
			t.Errorf("%s returned %v after its call, past its deadline (%v) and CancelGrace", name, took, wait)
		}
	}
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	took := time.Since(start)
	if took > 2*time.Second {
		t.Fatalf("Close took %v on a blackholed connection, want at most 2s", took)
	}
	t.Logf("Close took %v", took)
}
