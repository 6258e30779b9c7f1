package fenced_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// databases opens each dialect's test database.
func databases(t *testing.T) map[string]struct {
	db *sql.DB
	d  fenced.Dialect
} {
	t.Helper()
	testenv.Require(t, testenv.PostgresAddr(), testenv.MySQLAddr())
	pg, err := sql.Open("pgx", testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testenv.MySQLURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.DBName = "tcp", u.Host, u.User.Username(), strings.TrimPrefix(u.Path, "/")
	cfg.Passwd, _ = u.User.Password()
	my, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	lite, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "f.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	for _, db := range []*sql.DB{pg, my, lite} {
		t.Cleanup(func() { db.Close() })
	}
	return map[string]struct {
		db *sql.DB
		d  fenced.Dialect
	}{"postgres": {pg, fenced.Postgres}, "mysql": {my, fenced.MySQL}, "sqlite": {lite, fenced.SQLite}}
}

// A holder paused past its TTL wakes after the next holder has written:
// its guarded write is refused and nothing of it lands, while the same
// write unguarded lands over the later holder's (which is why the guard
// exists). The log table is the history of accepted writes: its fences
// never go down.
func TestPausedHolderRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			g, log := guarded(t, ctx, db.db, db.d, "seq INTEGER NOT NULL, who VARCHAR(8) NOT NULL, fence BIGINT NOT NULL")
			store := memlock.NewStore()
			a, b := client(t, store), client(t, store)
			// seq orders the log in commit order: each write appends
			// the next number, under the guard's row lock.
			write := func(who string, fence uint64) func(*sql.Tx) error {
				return func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO "+log+" (seq, who, fence) SELECT COALESCE(MAX(seq), 0) + 1, '"+who+"', "+fmt.Sprint(fence)+" FROM "+log)
					return err
				}
			}

			la, err := a.Acquire(ctx, "account", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Tx(ctx, "account", la.Fence(), write("a", la.Fence())); err != nil {
				t.Fatalf("a's write while it holds the lock: %v", err)
			}
			// a pauses: its TTL runs out, b takes the lock and writes.
			lb, err := b.Acquire(ctx, "account")
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Release(ctx)
			if err := g.Tx(ctx, "account", lb.Fence(), write("b", lb.Fence())); err != nil {
				t.Fatalf("b's write: %v", err)
			}
			// a wakes and writes, as a paused process would: refused.
			err = g.Tx(ctx, "account", la.Fence(), write("a", la.Fence()))
			if !errors.Is(err, fenced.ErrStale) {
				t.Fatalf("a's write after b's: %v, want ErrStale", err)
			}
			// b writes again with its own fence: accepted.
			if err := g.Tx(ctx, "account", lb.Fence(), write("b", lb.Fence())); err != nil {
				t.Fatalf("b's second write: %v", err)
			}
			if got := history(t, db.db, log); got != "a b b" {
				t.Fatalf("accepted writes %q, want a b b", got)
			}
			// Bypassed: the stale write lands after the later holder's.
			tx, err := db.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := write("a", la.Fence())(tx); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if got := history(t, db.db, log); got != "a b b a" {
				t.Fatalf("unguarded, the writes are %q; want the stale one to land (a b b a)", got)
			}
		})
	}
}

// guarded returns a Guard on a table of its own and a log table with
// columns, both dropped at cleanup.
func guarded(t *testing.T, ctx context.Context, db *sql.DB, d fenced.Dialect, columns string) (*fenced.Guard, string) {
	t.Helper()
	suffix := testutil.RandHex(4)
	g, err := fenced.New(db, d, fenced.WithTable("fences_"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	log := "writes_" + suffix
	mustExec(t, db, "CREATE TABLE "+log+" ("+columns+")")
	t.Cleanup(func() {
		db.Exec("DROP TABLE " + log)
		db.Exec("DROP TABLE fences_" + suffix)
	})
	return g, log
}

func client(t *testing.T, s *memlock.Store) *locker.Client {
	d, err := memlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// history is the log's writers in commit order.
func history(t *testing.T, db *sql.DB, log string) string {
	t.Helper()
	rows, err := db.Query("SELECT who FROM " + log + " ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var who []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			t.Fatal(err)
		}
		who = append(who, w)
	}
	return strings.Join(who, " ")
}

func TestBadInput(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := fenced.New(nil, fenced.SQLite); !errors.Is(err, fenced.ErrInvalid) {
		t.Errorf("nil db: %v", err)
	}
	if _, err := fenced.New(db, fenced.Dialect(9)); !errors.Is(err, fenced.ErrInvalid) {
		t.Errorf("dialect 9: %v", err)
	}
	for _, table := range []string{"", "a;drop", "1a", "a.b.c", "x y", strings.Repeat("t", 64)} {
		if _, err := fenced.New(db, fenced.SQLite, fenced.WithTable(table)); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("table %q: %v", table, err)
		}
	}
	g, err := fenced.New(db, fenced.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	fn := func(*sql.Tx) error { ran = true; return nil }
	ctx := context.Background()
	for _, c := range []struct {
		res   string
		fence uint64
	}{{"", 1}, {strings.Repeat("r", 256), 1}, {"\xff", 1}, {"r", 0}, {"r", 1 << 63}} {
		if err := g.Tx(ctx, c.res, c.fence, fn); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("Tx(%q, %d): %v", c.res, c.fence, err)
		}
	}
	if ran {
		t.Error("fn ran for bad input")
	}
}

// Holders that overrun their TTL at random, writing as they go: the
// accepted writes, in commit order, never go back to a lower fence.
func TestOverrunningHoldersOrdered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			g, log := guarded(t, ctx, db.db, db.d, "seq INTEGER NOT NULL, fence BIGINT NOT NULL")
			store := memlock.NewStore()
			const workers, rounds = 4, 8
			var stale, accepted int
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range workers {
				c := client(t, store)
				wg.Go(func() {
					for r := range rounds {
						l, err := c.Acquire(ctx, "account", locker.TTL(100*time.Millisecond), locker.AutoRefresh(false))
						if err != nil {
							t.Error(err)
							return
						}
						for i := range 3 {
							if (w+r+i)%4 == 0 {
								time.Sleep(150 * time.Millisecond) // past the TTL: paused
							}
							err := g.Tx(ctx, "account", l.Fence(), func(tx *sql.Tx) error {
								_, err := tx.ExecContext(ctx, "INSERT INTO "+log+" (seq, fence) SELECT COALESCE(MAX(seq), 0) + 1, "+fmt.Sprint(l.Fence())+" FROM "+log)
								return err
							})
							mu.Lock()
							switch {
							case err == nil:
								accepted++
							case errors.Is(err, fenced.ErrStale):
								stale++
							default:
								t.Error(err)
							}
							mu.Unlock()
						}
						l.Release(ctx)
					}
				})
			}
			wg.Wait()
			rows, err := db.db.Query("SELECT seq, fence FROM " + log + " ORDER BY seq")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var last, n, prevSeq int64
			for rows.Next() {
				var seq, f int64
				if err := rows.Scan(&seq, &f); err != nil {
					t.Fatal(err)
				}
				if seq != prevSeq+1 || f < last {
					t.Fatalf("write %d (fence %d) after fence %d, seq %d: the log is out of order", seq, f, last, prevSeq)
				}
				prevSeq, last, n = seq, f, n+1
			}
			if int(n) != accepted || accepted == 0 || stale == 0 {
				t.Fatalf("%d writes logged, %d accepted, %d stale: want every accepted one logged, and some of each", n, accepted, stale)
			}
		})
	}
}
