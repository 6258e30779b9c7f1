package sqldb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// mysqlConfig returns the test server's configuration (LOCKER_MYSQL_URL),
// or skips (fails with LOCKER_REQUIRE_SERVERS=1) when it is unset or
// unreachable. The one place to switch to testenv.MySQLURL once it exists.
func mysqlConfig(t testing.TB) *gomysql.Config {
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
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, u.Path[1:]
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.InterpolateParams = true
	return cfg
}

var randHex = testutil.RandHex

// table is a MySQL table for one test, dropped at its end, and a *sql.DB
// for the test's own statements.
type table struct {
	name  string
	admin *sql.DB
	cfg   *gomysql.Config
}

func newTable(t *testing.T) *table {
	cfg := mysqlConfig(t)
	admin := openDB(t, cfg)
	name := "locks_" + randHex(6)
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP TABLE IF EXISTS `" + name + "`, `" + name + "_shared`"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return &table{name: name, admin: admin, cfg: cfg}
}

func openDB(t *testing.T, cfg *gomysql.Config) *sql.DB {
	t.Helper()
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// driver opens a driver on its own *sql.DB, as another process would.
func (tb *table) driver(t *testing.T) *sqldb.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := gomysql.NewConnector(tb.cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := sqldb.Open(ctx, sql.OpenDB(conn), sqldb.MySQL, sqldb.WithTable(tb.name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Holders of one name, acquiring and releasing as fast as they can from
// several *sql.DBs, never overlap, and get fences that increase in the
// order they held it, though every release deletes the row the next
// acquisition inserts again.
func TestFencesIncreaseAcrossReleases(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := history.New()
	const workers, rounds = 4, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		d := tb.driver(t)
		wg.Go(func() {
			for got := 0; got < rounds && ctx.Err() == nil; {
				c := backend.Claim{Key: "ns/hot", Token: randHex(16), TTL: 10 * time.Second}
				h := rec.Begin(c.Key, fmt.Sprint("driver ", w), c.TTL)
				g, err := d.TryAcquire(ctx, c)
				if errors.Is(err, backend.ErrNotAcquired) {
					h.Failed(err)
					continue
				}
				if err != nil {
					h.Failed(err)
					errs <- err
					return
				}
				h.Acquired(g.Fence)
				c.Fence = g.Fence
				h.ReleaseStart()
				err = d.Release(ctx, c)
				h.Released(err)
				if err != nil {
					errs <- err
					return
				}
				got++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	res := rec.Check(history.Options{})
	if !res.OK() {
		t.Fatal(res.Report())
	}
	if res.Acquired != workers*rounds {
		t.Fatalf("%d acquisitions, want %d", res.Acquired, workers*rounds)
	}
}

// A takeover draws a new fence, whether the row was deleted behind the
// holder's back (by an operator, on the server) or expired; the removed
// holder learns of it at its next refresh. Contenders racing for one
// expired row: exactly one wins.
func TestFencesIncreaseAcrossServerDeleteAndTakeover(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, other := tb.driver(t), tb.driver(t)
	a := backend.Claim{Key: "ns/taken", Token: randHex(16), TTL: time.Minute}
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	a.Fence = g.Fence
	if _, err := tb.admin.ExecContext(ctx, "DELETE FROM `"+tb.name+"` WHERE name = ?", a.Key); err != nil {
		t.Fatal(err)
	}
	b := backend.Claim{Key: a.Key, Token: randHex(16), TTL: time.Minute}
	g, err = other.TryAcquire(ctx, b)
	if err != nil || g.Fence <= a.Fence {
		t.Fatalf("TryAcquire after the row's deletion = %+v, %v: want a fence above %d", g, err, a.Fence)
	}
	b.Fence = g.Fence
	if err := d.Refresh(ctx, a); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("the removed holder's Refresh = %v, want ErrNotHeld", err)
	}
	last := b.Fence
	for round := range 20 {
		expire := "UPDATE `" + tb.name + "` SET expires_us = expires_us - 120000000 WHERE name = ?"
		if _, err := tb.admin.ExecContext(ctx, expire, a.Key); err != nil {
			t.Fatal(err)
		}
		drivers := []*sqldb.Driver{d, other, d, other, d, other}
		fences := make(chan uint64, len(drivers))
		var wg sync.WaitGroup
		for _, drv := range drivers {
			wg.Go(func() {
				g, err := drv.TryAcquire(ctx, backend.Claim{Key: a.Key, Token: randHex(16), TTL: time.Minute})
				switch {
				case err == nil:
					fences <- g.Fence
				case !errors.Is(err, backend.ErrNotAcquired):
					t.Errorf("round %d: TryAcquire: %v", round, err)
				}
			})
		}
		wg.Wait()
		close(fences)
		var won []uint64
		for f := range fences {
			won = append(won, f)
		}
		if len(won) != 1 || won[0] <= last {
			t.Fatalf("round %d: fences %v won the expired row, want one above %d", round, won, last)
		}
		last = won[0]
	}
}
