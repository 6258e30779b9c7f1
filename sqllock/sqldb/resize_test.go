package sqldb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/objects"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// A limit record stands on a free semaphore too, judges claims under
// any limit, outlives its holders and no claim's token takes it; Resize
// 0 leaves nothing of the name. Both dialects.
func TestResizeRecord(t *testing.T) {
	t.Parallel()
	lite, _ := sqliteDriver(t)
	h := sqltest.NewMySQL(t, func(ctx context.Context, table string) (backend.Driver, error) {
		return New(sqltest.MySQLDB(t, sqltest.MySQLConfig(t)), MySQL, WithTable(table))
	})
	my, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	for name, d := range map[string]*Driver{"sqlite": lite, "mysql": my.(*Driver)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const key = "rz/a"
			limit := func(what string, held bool, want int) {
				t.Helper()
				st, err := d.Inspect(ctx, key, backend.Permit)
				if err != nil || st.Held != held || st.Limit != want || !st.Known.Has(backend.KnowsLimit) {
					t.Fatalf("Inspect %s = %+v, %v; want held %v, Limit %d", what, st, err, held, want)
				}
			}
			if err := d.Resize(ctx, key, 5); err != nil {
				t.Fatal(err)
			}
			limit("of a free semaphore resized to 5", false, 5)
			c := backend.Claim{Key: key, Token: testutil.Token(), TTL: time.Minute, Mode: backend.Permit, Limit: 2}
			g, err := d.TryAcquire(ctx, c)
			if err != nil {
				t.Fatalf("a claim under 2 of a semaphore resized to 5: %v", err)
			}
			c.Fence = g.Fence
			limit("with a holder granted under the record", true, 5)
			forged := backend.Claim{Key: key, Token: objects.RecordToken, TTL: time.Minute, Mode: backend.Permit, Limit: 5}
			if _, err := d.TryAcquire(ctx, forged); !errors.Is(err, backend.ErrNotAcquired) {
				t.Fatalf("a claim with the record's token = %v, want ErrNotAcquired", err)
			}
			if err := d.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			limit("after the holder left", false, 5)
			if err := d.Resize(ctx, key, 0); err != nil {
				t.Fatal(err)
			}
			limit("after Resize 0", false, 0)
			var rows int
			if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+d.shared+` WHERE name = ?`, key).Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("rows of the name after Resize 0 = %d, %v; want 0 (not even the anchor)", rows, err)
			}
		})
	}
}

// A Resize wakes another driver's subscribers through its poller: the
// record takes a new fence.
func TestResizeWakesPollers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, path := sqliteDriver(t)
	b, err := New(sqltest.SQLiteDB(t, path), SQLite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	const key = "rz/w"
	if err := a.Resize(ctx, key, 1); err != nil {
		t.Fatal(err)
	}
	take := func() backend.Claim {
		c := backend.Claim{Key: key, Token: testutil.Token(), TTL: time.Minute, Mode: backend.Permit, Limit: 1}
		g, err := a.TryAcquire(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Fence = g.Fence
		return c
	}
	held := take()
	woke, unsubscribe, err := b.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	// Until b's poller has seen the semaphore: holders that change wake it.
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("b's poller never saw the holders change")
		}
		if err := a.Release(ctx, held); err != nil {
			t.Fatal(err)
		}
		held = take()
		select {
		case <-woke:
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	// Nothing changes now: a wake-up left from the loop comes within a
	// few looks of 50 ms.
	select {
	case <-woke:
	case <-time.After(500 * time.Millisecond):
	}
	if err := a.Resize(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("a raised limit did not wake another driver's subscriber")
	}
	a.Release(ctx, held)
	a.Resize(ctx, key, 0)
}
