package sqllock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
)

// A set is one statement: all of its keys or none, with an expired or
// the token's own row taken again, and a partial take undone.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	d, _ := testDriver(t)
	ctx := context.Background()
	set := func(keys ...string) []backend.Claim {
		cs := make([]backend.Claim, len(keys))
		for i, k := range keys {
			cs[i] = backend.Claim{Key: k, Token: randHex(16), TTL: time.Minute, Owner: "set"}
		}
		return cs
	}
	cs := set("s/a", "s/b", "s/c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("TryAcquireAll of free keys: %v %v", gs, err)
	}
	for i, g := range gs {
		if g.Fence == 0 || g.TTL != time.Minute {
			t.Fatalf("grant %d: %+v", i, g)
		}
		cs[i].Fence = g.Fence
	}
	// c's TTL runs out: a set over it takes it; b is held: that set is
	// refused whole, and its free key d stays free.
	short := set("s/x")[0]
	short.Key, short.TTL = "s/y", time.Millisecond
	if _, err := d.TryAcquire(ctx, short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	refused := set("s/b", "s/d")
	if _, err := d.TryAcquireAll(ctx, refused); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held key: %v, want ErrNotAcquired", err)
	}
	if st, err := d.Inspect(ctx, "s/d", backend.Exclusive); err != nil || st.Held {
		t.Fatalf("s/d after the refused set: %+v %v, want free (the statement undone)", st, err)
	}
	over := set("s/d", "s/y")
	if gs, err := d.TryAcquireAll(ctx, over); err != nil || gs[1].Fence <= 0 {
		t.Fatalf("TryAcquireAll over an expired key: %v %v", gs, err)
	}
	// Released in one round trip: each key freed, a second release is
	// not held.
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("second ReleaseAll %s: %v, want ErrNotHeld", cs[i].Key, err)
		}
	}
	if gs, err := d.TryAcquireAll(ctx, set("s/a", "s/b", "s/c")); err != nil || gs[0].Fence <= cs[0].Fence {
		t.Fatalf("TryAcquireAll after the release: %v %v, want fences above the first set's", gs, err)
	}
}

// A set costs the round trips of one name: one statement to take it,
// one to release it, one to find it held, however many keys it has.
func TestSetRoundTrips(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sent atomic.Int64 // statements and prepares
	// One connection, so that the first cycle prepares every statement.
	_, d := oneConnDriver(t, ctx, roundTrips{&sent})
	testutil.SetRoundTrips(t, ctx, d, sent.Load) // the table's check, the statements' prepares
	if a, f, r := testutil.SetRoundTrips(t, ctx, d, sent.Load); a != 1 || f != 1 || r != 1 {
		t.Fatalf("round trips of a set of 4: acquire %d, refused %d, release %d; want 1 each", a, f, r)
	}
}

// roundTrips counts the statements and prepares sent on a connection.
type roundTrips struct{ n *atomic.Int64 }

func (c roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

func (c roundTrips) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared { // sent nothing
		c.n.Add(1)
	}
}

// The set's statement, which the driver keeps prepared outside pgx's
// cache, is prepared again after the server forgot it, as the cache's are.
func TestSetStatementPreparedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, d := oneConnDriver(t, ctx, nil) // the connection that forgets is the set's
	set := func() []backend.Claim {
		return []backend.Claim{{Key: "p/a", Token: randHex(16), TTL: time.Minute}, {Key: "p/b", Token: randHex(16), TTL: time.Minute}}
	}
	if _, err := d.TryAcquireAll(ctx, set()); err != nil {
		t.Fatalf("TryAcquireAll: %v", err)
	}
	if _, err := pool.Exec(ctx, "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquireAll(ctx, set()); err == nil || errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll of a statement the server forgot: %v, want its error", err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+d.sql.table+" WHERE name LIKE 'p/%'"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquireAll(ctx, set()); err != nil {
		t.Fatalf("TryAcquireAll after that: %v, want the set (prepared again)", err)
	}
}

// oneConnDriver is a driver on a fresh table and a pool of one connection,
// traced by tracer unless nil; both are closed at cleanup.
func oneConnDriver(t *testing.T, ctx context.Context, tracer pgx.QueryTracer) (*pgxpool.Pool, *Driver) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d, err := New(pool, WithTable(testTable(t, adminPool(t), "")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return pool, d
}
