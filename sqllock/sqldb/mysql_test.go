package sqldb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

var randHex = testutil.RandHex

// newTable is a harness on a table of its own, whose drivers are
// sqldb.Open's, each on a *sql.DB of its own, as another process's.
func newTable(t *testing.T) *sqltest.MySQL {
	cfg := sqltest.MySQLConfig(t)
	return sqltest.NewMySQL(t, func(ctx context.Context, table string) (backend.Driver, error) {
		conn, err := gomysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		return sqldb.Open(ctx, sql.OpenDB(conn), sqldb.MySQL, sqldb.WithTable(table))
	})
}

// driver opens a driver of h, closed at cleanup.
func driver(t *testing.T, h *sqltest.MySQL) *sqldb.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.(*sqldb.Driver)
}

// Holders of one name, acquiring and releasing as fast as they can from
// several *sql.DBs, never overlap, and get fences that increase in the
// order they held it, though every release frees the row that the next
// acquisition takes again.
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
		d := driver(t, tb)
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
	d, other := driver(t, tb), driver(t, tb)
	a := backend.Claim{Key: "ns/taken", Token: randHex(16), TTL: time.Minute}
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	a.Fence = g.Fence
	if _, err := tb.Admin.ExecContext(ctx, "DELETE FROM `"+tb.Table+"` WHERE name = ?", a.Key); err != nil {
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
		expire := "UPDATE `" + tb.Table + "` SET expires_us = expires_us - 120000000 WHERE name = ?"
		if _, err := tb.Admin.ExecContext(ctx, expire, a.Key); err != nil {
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

// RefreshMany refreshes the claims still held, and reports ErrNotHeld
// for a forged token, a stale fence, an expired lock and a key never
// held, ErrInvalidTTL for a bad TTL, each at its own position; a
// semaphore's permit among them is refreshed too.
func TestRefreshMany(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	d := driver(t, tb)
	ctx := context.Background()
	var held []backend.Claim
	for i := range 5 {
		c := backend.Claim{Key: "many/" + string(rune('a'+i)), Token: randHex(16), TTL: 300 * time.Millisecond}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		held = append(held, c)
	}
	permit := backend.Claim{Key: "many/sem", Token: randHex(16), TTL: 300 * time.Millisecond, Mode: backend.Permit, Limit: 2}
	g, err := d.TryAcquire(ctx, permit)
	if err != nil {
		t.Fatal(err)
	}
	permit.Fence = g.Fence
	expire := "UPDATE `" + tb.Table + "` SET expires_us = expires_us - 1000000 WHERE name = ?"
	if _, err := tb.Admin.ExecContext(ctx, expire, held[3].Key); err != nil {
		t.Fatal(err)
	}
	forged := held[1]
	forged.Token = randHex(16)
	stale := held[2]
	stale.Fence++
	bad := held[4]
	bad.TTL = 0
	batch := []backend.Claim{held[0], forged, stale, held[3], bad, held[1], {Key: "many/none", Token: randHex(16), TTL: time.Second}, permit}
	for i := range batch {
		if batch[i].TTL > 0 {
			batch[i].TTL = 5 * time.Second
		}
	}
	errs := d.RefreshMany(ctx, batch)
	want := []error{nil, backend.ErrNotHeld, backend.ErrNotHeld, backend.ErrNotHeld, backend.ErrInvalidTTL, nil, backend.ErrNotHeld, nil}
	if len(errs) != len(want) {
		t.Fatalf("%d results for %d claims", len(errs), len(batch))
	}
	for i := range want {
		if (want[i] == nil) != (errs[i] == nil) || want[i] != nil && !errors.Is(errs[i], want[i]) {
			t.Errorf("claim %d: %v, want %v", i, errs[i], want[i])
		}
	}
	time.Sleep(500 * time.Millisecond) // past the first TTL: only the refreshed live on
	for i, c := range held {
		st, err := d.Inspect(ctx, c.Key, backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		if wantHeld := i == 0 || i == 1; st.Held != wantHeld {
			t.Errorf("lock %d held %v, want %v", i, st.Held, wantHeld)
		}
	}
	permit.TTL = time.Second
	if err := d.Release(ctx, permit); err != nil {
		t.Errorf("the refreshed permit's Release: %v", err)
	}
}

// List matches its prefix byte for byte (no LIKE wildcard), sorts by the
// names' bytes, and reads past a page.
func TestListPrefixIsLiteral(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	d := driver(t, tb)
	ctx := context.Background()
	keys := []string{`lk/a_b`, `lk/axb`, `lk/a%`, `lk/ay`, `lk/a\`, `lk/a\b`, "lk/é", "lk/éa", "lk/z\U0010FFFF"}
	for _, k := range keys {
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: k, Token: randHex(16), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string][]string{
		`lk/a_`:        {`lk/a_b`},
		`lk/a%`:        {`lk/a%`},
		`lk/a\`:        {`lk/a\`, `lk/a\b`},
		"lk/é":         {"lk/é", "lk/éa"},
		"lk/\xc3":      {"lk/é", "lk/éa"},
		"lk/z\xf4":     {"lk/z\U0010FFFF"},
		"lk/none":      nil,
		``:             {`lk/a%`, `lk/a\`, `lk/a\b`, `lk/a_b`, `lk/axb`, `lk/ay`, "lk/z\U0010FFFF", "lk/é", "lk/éa"},
		"\xff\xff\xff": nil,
	} {
		got, err := d.List(ctx, prefix, backend.Exclusive)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		var names []string
		for _, st := range got {
			names = append(names, st.Key)
		}
		if fmt.Sprint(names) != fmt.Sprint(want) {
			t.Errorf("List(%q) = %q, want %q", prefix, names, want)
		}
	}
	// More than a page (500).
	for i := range 1100 {
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: fmt.Sprintf("pg/%04d", i), Token: randHex(16), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := d.List(ctx, "pg/", backend.Exclusive)
	if err != nil || len(got) != 1100 || got[0].Key != "pg/0000" || got[1099].Key != "pg/1099" {
		t.Fatalf("List over three pages: %d states, %v", len(got), err)
	}
}

// An acquisition whose caller gives up while the server keeps its INSERT
// waiting (here, on a row lock of another transaction) returns within
// backend.CancelGrace, and when the server applies the INSERT later,
// the driver undoes it: the name does not stay held for the TTL.
func TestCancelledAcquisitionLandingLateIsUndone(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	d, other := driver(t, tb), driver(t, tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "late/" + randHex(4)
	tx, err := tb.Admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// An uncommitted row of the name: the driver's INSERT waits for it.
	if _, err := tx.ExecContext(ctx, "INSERT INTO `"+tb.Table+"` (name, token, owner, expires_us, fence) VALUES (?, 'x', '', 0, 1)", key); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer ccancel()
	start := time.Now()
	_, err = d.TryAcquire(cctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire past its deadline = %v, want the deadline's error", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond+backend.CancelGrace {
		t.Fatalf("TryAcquire returned %v after its call, past its deadline and CancelGrace", took)
	}
	// The server now applies the waiting INSERT: a grant nobody holds.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, err := other.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute})
		if err == nil {
			if g.Fence == 0 {
				t.Fatal("no fence")
			}
			return
		}
		if !errors.Is(err, backend.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("another TryAcquire after the late INSERT = %v: the name stayed held", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
