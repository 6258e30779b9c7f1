package sqllock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// terminate ends, from the server side, every backend of application name
// app, and returns how many it ended.
func terminate(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	err := admin.QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n)
	if err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	return n
}

// The server kills the holder's connection mid-hold: the lock lives in a
// row, not in the connection, so it stays valid until its TTL and the next
// refresh succeeds on a new connection.
func TestTerminateHolderConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	app := "sqllock-term-" + randHex(4)
	d, err := Open(ctx, withParams(t, h.url, "application_name", app, "pool_max_conns", "2"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	l := backend.Claim{Key: "term/x", Token: randHex(16), TTL: 3 * time.Second}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	l.Fence = g.Fence
	var before []int32
	if err := pgxScanPids(ctx, h.admin, app, &before); err != nil || len(before) == 0 {
		t.Fatalf("holder's backends: %v %v", before, err)
	}
	if n := terminate(t, h.admin, app); n == 0 {
		t.Fatal("no backend terminated")
	}
	if _, err := other.TryAcquire(ctx, backend.Claim{Key: l.Key, Token: randHex(16), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire by another after the holder's connection died = %v, want ErrNotAcquired", err)
	}
	if err := d.Refresh(ctx, l); err != nil {
		t.Fatalf("Refresh after the connection was terminated: %v", err)
	}
	var after []int32
	if err := pgxScanPids(ctx, h.admin, app, &after); err != nil {
		t.Fatal(err)
	}
	for _, p := range after {
		for _, q := range before {
			if p == q {
				t.Fatalf("backend %d survived pg_terminate_backend", p)
			}
		}
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}

	// Through the Client: the watchdog keeps the lock across repeated
	// terminations, and Lost never fires.
	c, err := locker.New(d, locker.WithNamespace("term"))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := c.TryAcquire(ctx, "y", locker.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		time.Sleep(400 * time.Millisecond)
		terminate(t, h.admin, app)
	}
	time.Sleep(time.Second)
	select {
	case <-lk.Lost():
		t.Fatalf("lock lost after terminations: %v", lk.Err())
	default:
	}
	if _, err := other.TryAcquire(ctx, backend.Claim{Key: backend.Key("term", "y"), Token: randHex(16), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire by another = %v, want ErrNotAcquired", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// c owns d now; the deferred d.Close reports ErrClosed, which is fine.
	c.Close()
}

func pgxScanPids(ctx context.Context, admin *pgxpool.Pool, app string, out *[]int32) error {
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return err
	}
	*out, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	return err
}

// The listening connection is terminated: the driver reconnects, wakes its
// subscribers (releases may have been missed), and hears the next release.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	app := "sqllock-listen-" + randHex(4)
	d, err := Open(ctx, withParams(t, h.url, "application_name", app))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	key := "listen/x"
	l := backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute}
	if _, err := other.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	ch, cancel, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if n := terminate(t, h.admin, app); n == 0 {
		t.Fatal("no backend terminated")
	}
	select {
	case <-ch: // woken by the reconnection
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after the listening connection was terminated")
	}
	// Wait until the new connection listens, then release.
	deadline := time.Now().Add(10 * time.Second)
	for listening(t, h.admin, app) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The reconnection wakes twice (lost, back): drop the second, so that
	// the next wake-up is the release's. The terminated presence
	// connection took the key's presence with it: the driver finds that
	// out and wakes the subscriber, or the release notifies.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-ch:
	default:
	}
	if err := other.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("release not notified after the listener reconnected")
	}
}

// listening counts the connections of application app that LISTEN: their
// last statement was the LISTEN, or a key's presence lock, which the
// listening connection takes after it.
func listening(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	sql := newStatements("", defaultTable)
	var n int
	if err := admin.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND (query LIKE 'LISTEN %' OR query IN ($2, $3))`,
		app, sql.presenceLock, sql.presenceUnlock).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// One listening connection serves every waiter of a driver, whatever the
// keys, and each waiter hears only its key.
func TestOneListenerForAllWaiters(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	app := "sqllock-mux-" + randHex(4)
	d, err := Open(ctx, withParams(t, h.url, "application_name", app))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const keys, perKey = 10, 3
	var chans [keys][perKey]<-chan struct{}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for k := range keys {
		for j := range perKey {
			wg.Go(func() {
				ch, cancel, err := d.Subscribe(ctx, fmt.Sprintf("mux/%d", k))
				if err != nil {
					failed.Add(1)
					return
				}
				t.Cleanup(cancel)
				chans[k][j] = ch
			})
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d subscriptions failed", failed.Load())
	}
	if n := listening(t, h.admin, app); n != 1 {
		t.Fatalf("%d listening connections for %d subscribers, want 1", n, keys*perKey)
	}
	// Drain the wake-up of the first connection.
	time.Sleep(100 * time.Millisecond)
	for k := range keys {
		for j := range perKey {
			select {
			case <-chans[k][j]:
			default:
			}
		}
	}
	l := backend.Claim{Key: "mux/3", Token: randHex(16), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	for j := range perKey {
		select {
		case <-chans[3][j]:
		case <-time.After(5 * time.Second):
			t.Fatalf("subscriber %d of the released key not woken", j)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for k := range keys {
		for j := range perKey {
			select {
			case <-chans[k][j]:
				if k != 3 {
					t.Errorf("subscriber of mux/%d woken by the release of mux/3", k)
				}
			default:
			}
		}
	}
}

// Several processes create the same table (and schema) at the same time,
// each with its own connection: all succeed and then share the table.
func TestSchemaCreatedByManyAtOnce(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	schema := "sqllock_s_" + randHex(4)
	table := testTable(t, admin, schema)
	u := withParams(t, baseURL(t), paramTable, table, paramSchema, schema)

	// Processes: this test binary, re-executed.
	const procs = 6
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	start := time.Now().Add(500 * time.Millisecond)
	for i := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestChildCreateSchema$", "-test.count=1")
			cmd.Env = append(os.Environ(), "SQLLOCK_CHILD_URL="+u,
				fmt.Sprintf("SQLLOCK_CHILD_START=%d", start.UnixNano()),
				fmt.Sprintf("SQLLOCK_CHILD_KEY=proc-%d", i))
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs <- fmt.Errorf("process %d: %v\n%s", i, err, out)
			}
		})
	}
	// Goroutines with separate pools, at the same moment.
	const gs = 8
	drivers := make([]*Driver, gs)
	for i := range gs {
		wg.Go(func() {
			time.Sleep(time.Until(start))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := Open(ctx, u)
			if err != nil {
				errs <- fmt.Errorf("goroutine %d: Open: %w", i, err)
				return
			}
			drivers[i] = d
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ctx := context.Background()
	for i, d := range drivers {
		if d == nil {
			continue
		}
		l := backend.Claim{Key: fmt.Sprintf("goroutine-%d", i), Token: randHex(16), TTL: time.Minute}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Errorf("driver %d: TryAcquire: %v", i, err)
		}
		d.Close()
	}
	var rows int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+newStatements(schema, table).table+` WHERE name <> $1`, notifyKeyName).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != procs+gs {
		t.Errorf("%d rows, want one per process and goroutine, %d", rows, procs+gs)
	}
}

// TestChildCreateSchema is the child process of TestSchemaCreatedByManyAtOnce.
func TestChildCreateSchema(t *testing.T) {
	u := os.Getenv("SQLLOCK_CHILD_URL")
	if u == "" {
		t.Skip("child process of TestSchemaCreatedByManyAtOnce")
	}
	var at int64
	fmt.Sscan(os.Getenv("SQLLOCK_CHILD_START"), &at)
	time.Sleep(time.Until(time.Unix(0, at)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer d.Close()
	l := backend.Claim{Key: os.Getenv("SQLLOCK_CHILD_KEY"), Token: randHex(16), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
}

// Many first inserts of one key at once, on separate connections, even
// under SERIALIZABLE as the default isolation: one wins, every other gets
// ErrNotAcquired, never another error.
func TestFirstInsertRace(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"read committed", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			admin := adminPool(t)
			table := testTable(t, admin, "")
			cfg, err := pgxpool.ParseConfig(baseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			cfg.MaxConns = 16
			ctx := context.Background()
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
			for round := range 5 {
				key := fmt.Sprintf("race/%d", round)
				const n = 12
				var wins atomic.Int32
				var wg sync.WaitGroup
				gate := make(chan struct{})
				for range n {
					wg.Go(func() {
						<-gate
						_, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute})
						switch {
						case err == nil:
							wins.Add(1)
						case !errors.Is(err, backend.ErrNotAcquired):
							t.Errorf("TryAcquire: %v, want nil or ErrNotAcquired", err)
						}
					})
				}
				close(gate)
				wg.Wait()
				if wins.Load() != 1 {
					t.Fatalf("round %d: %d winners", round, wins.Load())
				}
			}
			// The user's pool is still open after the driver's Close.
			d.Close()
			if err := pool.Ping(ctx); err != nil {
				t.Fatalf("the caller's pool after Close: %v", err)
			}
		})
	}
}

// The listening connection closes ListenIdle after the last subscriber
// left, and opens again for the next one.
func TestListenerIdles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	app := "sqllock-idle-" + randHex(4)
	d, err := Open(ctx, withParams(t, h.url, "application_name", app), WithListenIdle(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for round := range 2 {
		_, cancel, err := d.Subscribe(ctx, "idle/x")
		if err != nil {
			t.Fatalf("round %d: Subscribe: %v", round, err)
		}
		if n := listening(t, h.admin, app); n != 1 {
			t.Fatalf("round %d: %d listening connections, want 1", round, n)
		}
		cancel()
		cancel() // idempotent
		deadline := time.Now().Add(5 * time.Second)
		for listening(t, h.admin, app) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the listening connection stayed open", round)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
