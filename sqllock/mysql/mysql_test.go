package mysql

import (
	"context"
	"database/sql"
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
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

var (
	randHex    = testutil.RandHex
	withParams = sqltest.WithParams
)

// harness runs the conformance suite on a table of its own, with drivers
// from Open (the URL), or from sqldb.New on a *sql.DB made from a DSN
// with go-sql-driver's defaults (prepared statements).
type harness struct {
	*sqltest.MySQL
	t   *testing.T
	url string // with lock_table
}

func newHarness(t *testing.T, viaNew bool) *harness {
	h := &harness{t: t}
	h.MySQL = sqltest.NewMySQL(t, func(ctx context.Context, table string) (backend.Driver, error) {
		if !viaNew {
			return Open(ctx, h.url)
		}
		return h.newDriver(table)
	})
	h.url = withParams(t, sqltest.MySQLURL(t), "lock_table", h.Table, "retention", sqltest.Retention.String())
	return h
}

// newDriver is the engine on a user's *sql.DB, with prepared statements.
func (h *harness) newDriver(table string) (backend.Driver, error) {
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
	eng, err := sqldb.New(db, sqldb.MySQL, sqldb.WithTable(table), sqldb.WithRetention(sqltest.Retention))
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
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), sqltest.WatcherSite+".func1()")
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
		"Inspect": func(ctx context.Context) error { _, err := d.Inspect(ctx, held.Key, backend.Exclusive); return err },
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
