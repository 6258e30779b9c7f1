package sqllock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
)

// A grant's planner settings (see sharedStatements.lock) last for its
// transaction only: the caller's session, on a pool of the caller's, keeps
// its own, in the implicit transaction of the pipeline and in an explicit
// one.
func TestGrantSettingsStayInTransaction(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	table := testTable(t, admin, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the grant's connection is the one SHOW runs on
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := New(pool, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, explicit := range []bool{false, true} {
		d.explicitGrant.Store(explicit)
		c := backend.Claim{Key: "ns/plan", Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: 2}
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"enable_bitmapscan", "enable_seqscan"} {
			var v string
			if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if v != "on" {
				t.Fatalf("explicit %v: %s is %q after a grant, want on", explicit, name, v)
			}
		}
		c.Fence = g.Fence
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
}

// A grant that finds expired permits has them deleted: the table keeps
// only the semaphore's live holders.
func TestGrantDropsExpiredPermits(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := "ns/expired-permits"
	permit := func(ttl time.Duration) backend.Claim {
		return backend.Claim{Key: key, Token: randHex(16), TTL: ttl, Mode: backend.Permit, Limit: 2}
	}
	for range 2 {
		if _, err := d.TryAcquire(ctx, permit(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	live := permit(time.Minute)
	if _, err := d.TryAcquire(ctx, live); err != nil {
		t.Fatalf("a permit after the others expired: %v", err)
	}
	var rows int
	if err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+d.SharedTableName()+" WHERE name = $1", key).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d rows for the semaphore, want 1 (the live permit)", rows)
	}
}
