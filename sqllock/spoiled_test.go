package sqllock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A statement whose context ends is cancelled by the server and its
// connection survives it, but the pool never hands that connection out
// again (a late cancel would stop its next statement); the others it
// keeps. (PrepareConn refuses it: with AfterRelease, the former hook,
// pgxpool returned every connection in a goroutine of its own.)
func TestCancelledConnNotReused(t *testing.T) {
	h := newHarness(t, "pool_max_conns", "2")
	ctx := context.Background()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Released before Close, which waits for them, also on a failure.
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, c)
	spoiled := c.Conn().PgConn()
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	start := time.Now()
	_, err = c.Exec(sctx, "SELECT pg_sleep(5)")
	cancel()
	if err == nil {
		t.Fatal("pg_sleep(5) returned within a 50ms context")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the cancelled statement returned after %v", took)
	}
	if spoiled.IsClosed() {
		t.Fatalf("the connection was closed (pgx's default), not the statement cancelled by the server: %v", err)
	}
	held = nil
	c.Release()
	// A healthy connection, released, is handed out again.
	c1, err := d.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kept := c1.Conn().PgConn()
	c1.Release()
	if kept == spoiled {
		t.Fatal("the pool handed out the connection whose statement was cancelled")
	}
	// Every connection the pool can hand out at once (2): none is it.
	for round := range 3 {
		held = nil
		for range 2 {
			ac, err := d.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, ac)
			if ac.Conn().PgConn() == spoiled {
				t.Fatalf("round %d: the pool handed out the connection whose statement was cancelled", round)
			}
			if _, err := ac.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		sawKept := false
		for _, ac := range held {
			sawKept = sawKept || ac.Conn().PgConn() == kept
			ac.Release()
		}
		held = nil
		if !sawKept {
			t.Fatalf("round %d: a healthy connection was not reused", round)
		}
	}
}
