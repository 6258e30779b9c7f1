package fencedpgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedpgx"
	"github.com/lockerhq/locker/fenced/internal/fencetest"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"
)

// open opens a resource as a guard's table and a log table of the writes,
// both named after the resource, on a pool of its own.
func open(ctx context.Context, id, _ string) (fencetest.Store, func(), error) {
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		return nil, nil, err
	}
	s := store{pool: pool, log: "writes_" + id}
	drop := func() {
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+s.log+", fences_"+id)
		pool.Close()
	}
	if s.g, err = fencedpgx.New(pool, fenced.WithTable("fences_"+id)); err == nil {
		err = s.g.CreateTable(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, fencetest.CreateLog(s.log))
	}
	if err != nil {
		drop()
		return nil, nil, err
	}
	return s, drop, nil
}

type store struct {
	pool *pgxpool.Pool
	g    *fencedpgx.Guard
	log  string
}

func (s store) Write(ctx context.Context, who string, fence uint64, bypass bool) error {
	insert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, fencetest.InsertLog(s.log, who, fence))
		return err
	}
	if bypass {
		return pgx.BeginFunc(ctx, s.pool, insert)
	}
	return s.g.Tx(ctx, "account", fence, insert)
}

func (s store) Writes(ctx context.Context) ([]history.Write, error) {
	rows, _ := s.pool.Query(ctx, fencetest.SelectLog(s.log))
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (history.Write, error) {
		var w history.Write
		return w, r.Scan(&w.Who, &w.Fence)
	})
}

func TestPausedHolder(t *testing.T) {
	testenv.Require(t, testenv.PostgresAddr())
	fencetest.Paused(t, open)
}

func TestOverrunningHolders(t *testing.T) {
	testenv.Require(t, testenv.PostgresAddr())
	fencetest.Overrunning(t, open)
}

// Bad input is refused before any statement: the pool's server does not
// exist.
func TestBadInput(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, db := range []fencedpgx.DB{nil, (*pgxpool.Pool)(nil), (*pgx.Conn)(nil)} {
		if _, err := fencedpgx.New(db); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("New(%#v): %v", db, err)
		}
	}
	if _, err := fencedpgx.New(pool, fenced.WithTable("a;drop")); !errors.Is(err, fenced.ErrInvalid) {
		t.Errorf("table a;drop: %v", err)
	}
	g, err := fencedpgx.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(pgx.Tx) error { t.Error("fn ran for bad input"); return nil }
	for _, c := range []struct {
		res   string
		fence uint64
	}{{"", 1}, {strings.Repeat("r", 256), 1}, {"r", 0}, {"r", 1 << 63}} {
		if err := g.Tx(context.Background(), c.res, c.fence, fn); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("Tx(%q, %d): %v", c.res, c.fence, err)
		}
	}
}
