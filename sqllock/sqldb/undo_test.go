package sqldb_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// An acquisition whose fate is unknown (its statement's answer never
// came) is undone on another connection; that undo's own answer may not
// come either (undoTimeout), and the statement may still reach the server
// later. The Client's wait tries again with the same claim, token and
// all, which may be granted before the stale undo lands: the undo must
// not free that later grant, or a second holder gets in while the first
// believes it holds (it learns only at its next refresh). A set's undo
// too, after which the Client takes the names one by one. A semaphore's
// undo is a transaction under the object's anchor lock: its late COMMIT
// holds back the later grant, which the Permit case shows.
//
// Here the proxy delays what the driver sends by 6 s: the first try's
// statement outlives writeTimeout (5 s), its undo outlives undoTimeout
// (1 s) and lands at about 11 s; the second try, with no delay, is
// granted at about 7 s; another driver then tries the name until 14 s.
func TestStaleUndoSparesLaterGrant(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name  string
		mode  backend.Mode
		limit int
		set   bool // the first try a set's (the Client then takes its names one by one)
	}{{"Exclusive", backend.Exclusive, 0, false}, {"Permit", backend.Permit, 1, false}, {"Set", backend.Exclusive, 0, true}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			staleUndo(t, m.mode, m.limit, m.set)
		})
	}
}

func staleUndo(t *testing.T, mode backend.Mode, limit int, set bool) {
	tb := newTable(t)
	other := driver(t, tb)
	cfg := sqltest.MySQLConfig(t)
	p, err := faultproxy.New(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg.Addr = p.Addr()
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := sqldb.Open(ctx, db, sqldb.MySQL, sqldb.WithTable(tb.Table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })

	// Two idle connections, on each of which the driver has prepared its
	// statements, so that the undo goes out on one at once rather than
	// waiting on a prepare (database/sql hands out the last idle one).
	try := func(c backend.Claim) (backend.Grant, error) {
		if !set {
			return d.TryAcquire(ctx, c)
		}
		gs, err := d.TryAcquireAll(ctx, []backend.Claim{c})
		if err != nil {
			return backend.Grant{}, err
		}
		return gs[0], nil
	}
	prime := func() {
		c := backend.Claim{Key: "ns/prime", Token: randHex(16), TTL: time.Minute, Mode: mode, Limit: limit, Weight: min(limit, 1)}
		g, err := try(c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		c.Fence = 0
		if err := d.Release(ctx, c); !errors.Is(err, backend.ErrNotHeld) { // release, then forget
			t.Fatalf("second release: %v, want ErrNotHeld", err)
		}
	}
	take := func() *sql.Conn {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	x, y := take(), take()
	x.Close()
	prime()
	x = take()
	y.Close()
	prime()
	x.Close()

	c := backend.Claim{Key: "ns/n", Token: randHex(16), TTL: time.Minute, Mode: mode, Limit: limit, Weight: min(limit, 1)}
	start := time.Now()
	p.Delay(6*time.Second, 0)
	if _, err := try(c); err == nil || errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("first try through a 6 s delay: %v, want a failure to reach the store", err)
	}
	t.Logf("first try failed after %v", time.Since(start))
	p.Delay(0, 0)
	// A lock's statement lands at 6 s (a semaphore's transaction never
	// got past its first statement): the second try comes after it, else
	// the first would take the name again over the second's grant.
	for mode == backend.Exclusive {
		st, err := other.Inspect(ctx, c.Key, mode)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held {
			break
		}
		if time.Since(start) > 9*time.Second {
			t.Skip("the first try's statement did not land within 9 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	g, err := d.TryAcquire(ctx, c)
	if err != nil {
		t.Fatalf("second try: %v", err)
	}
	t.Logf("second try granted fence %d after %v", g.Fence, time.Since(start))
	if time.Since(start) > 10*time.Second {
		t.Skip("second try granted too late to tell")
	}
	for time.Since(start) < 14*time.Second {
		c2 := backend.Claim{Key: c.Key, Token: randHex(16), TTL: time.Minute, Mode: mode, Limit: limit, Weight: min(limit, 1)}
		g2, err := other.TryAcquire(ctx, c2)
		if err == nil {
			t.Fatalf("another driver was granted fence %d at %v while the second try holds fence %d", g2.Fence, time.Since(start), g.Fence)
		}
		if !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Fence = g.Fence
	if err := d.Refresh(ctx, c); err != nil {
		t.Fatalf("refresh of the second try's grant: %v", err)
	}
}
