package sqldb

import (
	"context"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// A limit record, on both dialects: see sqltest.ResizeRecord. Resize 0
// leaves not even the anchor.
func TestResizeRecord(t *testing.T) {
	t.Parallel()
	for name, d := range bothDialects(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const key = "rz/a"
			sqltest.ResizeRecord(t, ctx, d, key, func() (n int, err error) {
				err = d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+d.shared+` WHERE name = ?`, key).Scan(&n)
				return n, err
			})
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
