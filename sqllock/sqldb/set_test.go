package sqldb_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

func TestAcquireAllMySQL(t *testing.T) {
	t.Parallel()
	d := driver(t, newTable(t))
	db := sqltest.MySQLDB(t, sqltest.MySQLConfig(t))
	testAcquireAll(t, d, func(key string) {
		// The clock set back an hour: the set's statement draws no fence
		// from it.
		if _, err := db.Exec(`UPDATE `+d.TableName()+` SET fence = fence + 3600000000 WHERE name = ?`, key); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAcquireAllSQLite(t *testing.T) {
	t.Parallel()
	d, err := sqldb.New(sqltest.SQLiteDB(t, filepath.Join(t.TempDir(), "locks.db")), sqldb.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	testAcquireAll(t, d, nil)
}

// A set is one statement: all of its names or none, with an expired or
// the token's own row taken again; its release frees each claim's name
// and tells the others not held. aheadOf, if set, puts a name's fence
// ahead of the database's clock.
func testAcquireAll(t *testing.T, d *sqldb.Driver, aheadOf func(key string)) {
	ctx := context.Background()
	set := func(keys ...string) []backend.Claim {
		cs := make([]backend.Claim, len(keys))
		for i, k := range keys {
			cs[i] = backend.Claim{Key: k, Token: randHex(16), TTL: time.Minute, Owner: "set"}
		}
		return cs
	}
	held := func(key string) bool {
		t.Helper()
		st, err := d.Inspect(ctx, key, backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		return st.Held
	}
	cs := set("s/a", "s/b", "s/c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("TryAcquireAll of free names: %v %v", gs, err)
	}
	for i, g := range gs {
		if g.Fence == 0 || g.TTL != time.Minute {
			t.Fatalf("grant %d: %+v", i, g)
		}
		cs[i].Fence = g.Fence
		if st, err := d.Inspect(ctx, cs[i].Key, backend.Exclusive); err != nil || st.Fence != g.Fence || st.Owner != "set" {
			t.Fatalf("%s after the set: %+v %v, want fence %d", cs[i].Key, st, err, g.Fence)
		}
	}
	// y's TTL runs out: a set over it takes it; b is held: that set is
	// refused whole, and its free name d stays free.
	short := set("s/y")[0]
	short.TTL = time.Millisecond
	gy, err := d.TryAcquire(ctx, short)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := d.TryAcquireAll(ctx, set("s/b", "s/d")); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held name: %v, want ErrNotAcquired", err)
	}
	if held("s/d") {
		t.Fatal("s/d held after the refused set")
	}
	over := set("s/d", "s/y")
	if gs, err := d.TryAcquireAll(ctx, over); err != nil || gs[1].Fence <= gy.Fence {
		t.Fatalf("TryAcquireAll over an expired name: %v %v, want y's fence above %d", gs, err, gy.Fence)
	} else {
		over[0].Fence, over[1].Fence = gs[0].Fence, gs[1].Fence
	}
	// Released in one statement: each name freed, a second release is
	// not held.
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil || held(cs[i].Key) {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("second ReleaseAll %s: %v, want ErrNotHeld", cs[i].Key, err)
		}
	}
	again := set("s/a", "s/b", "s/c")
	gs, err = d.TryAcquireAll(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		if g.Fence <= cs[i].Fence {
			t.Fatalf("%s: fence %d after the release, want above %d", again[i].Key, g.Fence, cs[i].Fence)
		}
		again[i].Fence = g.Fence
	}
	// A set of which one claim is not held (released alone) and one has
	// never had a row: the others are freed, those two not held.
	if err := d.Release(ctx, again[1]); err != nil {
		t.Fatal(err)
	}
	ghost := set("s/ghost")[0]
	ghost.Fence = again[2].Fence
	mixed := []backend.Claim{again[0], again[1], again[2], ghost}
	errs := d.ReleaseAll(ctx, mixed)
	for i, err := range errs {
		if (i == 1 || i == 3) != errors.Is(err, backend.ErrNotHeld) || i != 1 && i != 3 && err != nil {
			t.Fatalf("ReleaseAll %s: %v", mixed[i].Key, err)
		}
		if held(mixed[i].Key) {
			t.Fatalf("%s held after ReleaseAll", mixed[i].Key)
		}
	}
	errs = d.ReleaseAll(ctx, []backend.Claim{over[0], ghost, over[1]})
	if errs[0] != nil || !errors.Is(errs[1], backend.ErrNotHeld) || errs[2] != nil {
		t.Fatalf("ReleaseAll with a name without a row: %v", errs)
	}
	// More names than the driver prepares statements for (sent as
	// text), and none.
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("s/big/%02d", i))
	}
	big := set(keys...)
	gs, err = d.TryAcquireAll(ctx, big)
	if err != nil || len(gs) != len(big) {
		t.Fatalf("TryAcquireAll of %d names: %v %v", len(big), gs, err)
	}
	for i, g := range gs {
		big[i].Fence = g.Fence
	}
	if _, err := d.TryAcquireAll(ctx, set(keys[4:6]...)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll of 2 of them: %v, want ErrNotAcquired", err)
	}
	for i, err := range d.ReleaseAll(ctx, big) {
		if err != nil || held(big[i].Key) {
			t.Fatalf("ReleaseAll %s: %v", big[i].Key, err)
		}
	}
	if gs, err := d.TryAcquireAll(ctx, nil); err != nil || len(gs) != 0 {
		t.Fatalf("TryAcquireAll of no claims: %v %v", gs, err)
	}
	if errs := d.ReleaseAll(ctx, nil); len(errs) != 0 {
		t.Fatalf("ReleaseAll of no claims: %v", errs)
	}
	if aheadOf == nil {
		return
	}
	// A name whose last fence is ahead of the clock: the set is refused,
	// and its names taken one by one draw above it.
	c := set("s/e")[0]
	g, err := d.TryAcquire(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	c.Fence = g.Fence
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	aheadOf(c.Key)
	if _, err := d.TryAcquireAll(ctx, set("s/e", "s/f")); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a fence ahead of the clock: %v, want ErrNotAcquired", err)
	}
	if held("s/e") || held("s/f") {
		t.Fatal("a name held after the refused set")
	}
	if g2, err := d.TryAcquire(ctx, set("s/e")[0]); err != nil || g2.Fence <= g.Fence+3600000000 {
		t.Fatalf("TryAcquire after: %+v %v, want a fence above %d", g2, err, g.Fence+3600000000)
	}
}
