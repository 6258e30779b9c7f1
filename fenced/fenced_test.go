package fenced_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/internal/fencetest"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"
)

// databases are the guard's databases, each opened anew for a resource
// (SQLite's in dir).
func databases(t *testing.T) map[string]fencetest.Open {
	t.Helper()
	testenv.Require(t, testenv.PostgresAddr(), testenv.MySQLAddr())
	u, err := url.Parse(testenv.MySQLURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.DBName = "tcp", u.Host, u.User.Username(), strings.TrimPrefix(u.Path, "/")
	cfg.Passwd, _ = u.User.Password()
	return map[string]fencetest.Open{
		"postgres": guarded(fenced.Postgres, "pgx", func(string) string { return testenv.PostgresURL() }),
		"mysql":    guarded(fenced.MySQL, "mysql", func(string) string { return cfg.FormatDSN() }),
		"sqlite": guarded(fenced.SQLite, "sqlite", func(dir string) string {
			return "file:" + filepath.Join(dir, "f.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
		}),
	}
}

// guarded opens a resource as a guard's table and a log table of the
// writes, both named after the resource.
func guarded(d fenced.Dialect, driver string, dsn func(dir string) string) fencetest.Open {
	return func(ctx context.Context, id, dir string) (fencetest.Store, func(), error) {
		db, err := sql.Open(driver, dsn(dir))
		if err != nil {
			return nil, nil, err
		}
		s := sqlStore{db: db, log: "writes_" + id}
		drop := func() {
			db.Exec("DROP TABLE " + s.log)
			db.Exec("DROP TABLE fences_" + id)
			db.Close()
		}
		if s.g, err = fenced.New(db, d, fenced.WithTable("fences_"+id)); err == nil {
			err = s.g.CreateTable(ctx)
		}
		if err == nil {
			_, err = db.ExecContext(ctx, fencetest.CreateLog(s.log))
		}
		if err != nil {
			drop()
			return nil, nil, err
		}
		return s, drop, nil
	}
}

type sqlStore struct {
	db  *sql.DB
	g   *fenced.Guard
	log string
}

func (s sqlStore) Write(ctx context.Context, who string, fence uint64, bypass bool) error {
	insert := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, fencetest.InsertLog(s.log, who, fence))
		return err
	}
	if !bypass {
		return s.g.Tx(ctx, "account", fence, insert)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := insert(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (s sqlStore) Writes(ctx context.Context) ([]history.Write, error) {
	rows, err := s.db.QueryContext(ctx, fencetest.SelectLog(s.log))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ws []history.Write
	for rows.Next() {
		var w history.Write
		if err := rows.Scan(&w.Who, &w.Fence); err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	return ws, rows.Err()
}

func TestPausedHolder(t *testing.T) {
	for name, open := range databases(t) {
		t.Run(name, func(t *testing.T) { fencetest.Paused(t, open) })
	}
}

func TestOverrunningHolders(t *testing.T) {
	for name, open := range databases(t) {
		t.Run(name, func(t *testing.T) { fencetest.Overrunning(t, open) })
	}
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
