package sqllock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

func permit(key string, limit int, ttl time.Duration) backend.Claim {
	return backend.Claim{Key: key, Token: randHex(16), TTL: ttl, Mode: backend.Permit, Limit: limit}
}

// The driver's semaphore, statement by statement: the limit, the
// mismatch, expiry by the server's clock, fences, residue. Both protocols:
// behind PgBouncer the grant's pipeline is one simple query.
func TestSemaphoreStatements(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			d, h := testDriver(t, "default_query_exec_mode", mode)
			ctx := context.Background()
			key := "ns/sem"
			var last uint64
			var held []backend.Claim
			for range 3 {
				c := permit(key, 3, time.Minute)
				g, err := d.TryAcquire(ctx, c)
				if err != nil {
					t.Fatalf("permit %d: %v", len(held)+1, err)
				}
				if g.Fence <= last {
					t.Fatalf("fence %d after %d", g.Fence, last)
				}
				last, c.Fence = g.Fence, g.Fence
				held = append(held, c)
			}
			if _, err := d.TryAcquire(ctx, permit(key, 3, time.Minute)); !errors.Is(err, backend.ErrNotAcquired) {
				t.Fatalf("fourth permit of 3: %v, want ErrNotAcquired", err)
			}
			if _, err := d.TryAcquire(ctx, permit(key, 4, time.Minute)); !errors.Is(err, backend.ErrLimitMismatch) {
				t.Fatalf("limit 4 against 3: %v, want ErrLimitMismatch", err)
			}
			// A lock and a read-write lock of the name are other objects.
			if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute}); err != nil {
				t.Fatalf("the lock of the semaphore's name: %v", err)
			}
			if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute, Mode: backend.Write}); err != nil {
				t.Fatalf("the writer of the semaphore's name: %v", err)
			}
			// A forged token or fence changes nothing.
			forged := held[0]
			forged.Token = randHex(16)
			if err := d.Refresh(ctx, forged); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("refresh with a forged token: %v", err)
			}
			if err := d.Release(ctx, forged); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("release with a forged token: %v", err)
			}
			stale := held[0]
			stale.Fence++
			if err := d.Release(ctx, stale); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("release with a wrong fence: %v", err)
			}
			if err := d.Refresh(ctx, held[0]); err != nil {
				t.Fatalf("refresh: %v", err)
			}
			if err := d.Release(ctx, held[0]); err != nil {
				t.Fatalf("release: %v", err)
			}
			c := permit(key, 3, 50*time.Millisecond)
			g, err := d.TryAcquire(ctx, c)
			if err != nil || g.Fence <= last {
				t.Fatalf("permit after a release: %+v, %v (last fence %d)", g, err, last)
			}
			c.Fence = g.Fence
			time.Sleep(60 * time.Millisecond) // its TTL, by the server's clock
			if err := d.Refresh(ctx, c); !errors.Is(err, backend.ErrNotHeld) {
				t.Fatalf("refresh of an expired permit: %v", err)
			}
			if _, err := d.TryAcquire(ctx, permit(key, 3, time.Minute)); err != nil {
				t.Fatalf("permit after one expired: %v", err)
			}
			if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Second, Mode: backend.Permit}); !errors.Is(err, backend.ErrInvalidLimit) {
				t.Fatalf("limit 0: %v", err)
			}
			if err := d.Release(ctx, held[1]); err != nil {
				t.Fatal(err)
			}
			if err := d.Release(ctx, held[2]); err != nil {
				t.Fatal(err)
			}
			if n, err := h.sharedRows(ctx, key, " AND kind = 1"); err != nil || n != 1 {
				t.Fatalf("permit rows = %d (%v), want the one left (the expired one went with the next grant)", n, err)
			}
		})
	}
}

// The read-write lock's rules, statement by statement: readers share; a
// refused waiting writer's record keeps new readers out until it is
// granted or withdrawn; the writer's fence is above the readers'. A
// writer's TryAcquire, which waits for nothing, leaves no record.
func TestRWStatements(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx := context.Background()
	key := "ns/rw"
	claim := func(m backend.Mode) backend.Claim {
		return backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute, Mode: m}
	}
	r1, r2, w := claim(backend.Read), claim(backend.Read), claim(backend.Write)
	var top uint64
	for _, r := range []*backend.Claim{&r1, &r2} {
		g, err := d.TryAcquire(ctx, *r)
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
		r.Fence, top = g.Fence, max(top, g.Fence)
	}
	// A writer's refused try records it as waiting (backend.Modal).
	waitTry := func(c backend.Claim) (backend.Grant, error) { return d.TryAcquire(ctx, c) }
	if _, err := waitTry(w); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("waiting writer with readers: %v", err)
	}
	if _, err := d.TryAcquire(ctx, claim(backend.Read)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader behind a waiting writer: %v", err)
	}
	if _, err := waitTry(claim(backend.Write)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second writer: %v", err)
	}
	if n, err := h.Entries(ctx, key); err != nil || n != 3 {
		t.Fatalf("entries = %d (%v), want 2 readers and 1 waiting writer", n, err)
	}
	// The writer gives up: its record goes, and readers enter again.
	if err := d.Release(ctx, w); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("withdrawal: %v, want ErrNotHeld", err)
	}
	r3 := claim(backend.Read)
	g, err := d.TryAcquire(ctx, r3)
	if err != nil {
		t.Fatalf("reader after the withdrawal: %v", err)
	}
	r3.Fence, top = g.Fence, max(top, g.Fence)
	if _, err := waitTry(w); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatal(err)
	}
	for _, r := range []backend.Claim{r1, r2, r3} {
		if err := d.Release(ctx, r); err != nil {
			t.Fatalf("release reader: %v", err)
		}
	}
	g, err = waitTry(w)
	if err != nil || g.Fence <= top {
		t.Fatalf("writer once the readers left: %+v, %v (top reader fence %d)", g, err, top)
	}
	w.Fence = g.Fence
	if _, err := d.TryAcquire(ctx, claim(backend.Read)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader with a writer: %v", err)
	}
	if err := d.Refresh(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Residue(ctx, key); err != nil || n != 0 {
		t.Fatalf("residue %d (%v), want none", n, err)
	}
}

// A refresh in flight when its permit's TTL runs out (here, the refresh
// statement in a transaction that has not committed yet) and a grant of
// the slot: the grant waits for the refresh's object lock, then sees the
// permit extended and refuses. Without that order, the grant would count
// the permit as expired from its snapshot, and both would hold a semaphore
// of 1.
func TestSemaphoreGrantWaitsForRefreshInFlight(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := permit("ns/inflight", 1, 300*time.Millisecond)
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := h.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var pos int64
	err = tx.QueryRow(ctx, h.sh.refresh, []string{a.Key}, []string{a.Token}, []int64{int64(g.Fence)},
		[]int64{time.Minute.Microseconds()}, []string{""}, []int16{kindPermit}, []int32{h.sh.semClass}).Scan(&pos)
	if err != nil {
		t.Fatalf("refresh in the transaction: %v", err)
	}
	time.Sleep(400 * time.Millisecond) // past the TTL it had before the refresh
	got := make(chan error, 1)
	go func() {
		_, err := d.TryAcquire(ctx, permit(a.Key, 1, time.Minute))
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("the grant did not wait for the refresh in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("grant over a permit refreshed in flight: %v, want ErrNotAcquired", err)
	}
}

// Through the Client: 8 goroutines on each of 2 clients, a semaphore of
// 3, never more than 3 inside; a read-write lock whose writer excludes
// the readers.
func TestClientSemaphoreAndRW(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var clients []*locker.Client
	for range 2 {
		drv, err := Open(ctx, h.url)
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(drv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	var inside, most, readers, writers atomic.Int32
	var bad atomic.Value
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%2]
			for range 5 {
				err := c.Do(ctx, "sem", func(context.Context) error {
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(2 * time.Millisecond)
					inside.Add(-1)
					return nil
				}, locker.Semaphore(3), locker.TTL(2*time.Second))
				if err != nil {
					bad.Store(err)
					return
				}
				mode := locker.Read()
				if i%4 == 0 {
					mode = locker.Write()
				}
				err = c.Do(ctx, "rw", func(context.Context) error {
					if i%4 == 0 {
						if writers.Add(1) != 1 || readers.Load() != 0 {
							bad.Store(errors.New("a writer with another holder"))
						}
						time.Sleep(time.Millisecond)
						writers.Add(-1)
					} else {
						readers.Add(1)
						if writers.Load() != 0 {
							bad.Store(errors.New("a reader with a writer"))
						}
						time.Sleep(time.Millisecond)
						readers.Add(-1)
					}
					return nil
				}, mode, locker.TTL(2*time.Second))
				if err != nil {
					bad.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m > 3 || m < 2 {
		t.Fatalf("at most %d inside a semaphore of 3, want 2 or 3", m)
	}
	for _, key := range []string{"sem", "rw"} {
		if n, err := h.Residue(ctx, backend.Key("locker", key)); err != nil || n != 0 {
			t.Errorf("residue of %s: %d (%v)", key, n, err)
		}
	}
}

// With create_table=false, the shared table must be there: locks work
// without it, a semaphore says to run shared.sql, and works once it ran.
func TestSharedTableCreateFalse(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	ctx := context.Background()
	table := testTable(t, admin, "")
	if _, err := admin.Exec(ctx, schemaFor(quote(table))); err != nil {
		t.Fatal(err)
	}
	d, err := Open(ctx, withParams(t, baseURL(t), paramTable, table, paramCreate, "false"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/k", Token: randHex(16), TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, permit("ns/k", 2, time.Second)); err == nil || !strings.Contains(err.Error(), "shared.sql") {
		t.Fatalf("permit without the shared table: %v, want an error naming shared.sql", err)
	}
	if _, err := admin.Exec(ctx, strings.ReplaceAll(SharedSchemaSQL, defaultShared, d.SharedTableName())); err != nil {
		t.Fatalf("shared.sql: %v", err)
	}
	if _, err := d.TryAcquire(ctx, permit("ns/k", 2, time.Second)); err != nil {
		t.Fatalf("permit with the shared table: %v", err)
	}
}

// Names that need quoting, in a schema of their own, and a table name so
// long that the shared table's is a hash: a semaphore and a writer work,
// and their releases notify.
func TestSharedQuotedNames(t *testing.T) {
	t.Parallel()
	if n := sharedIdent(strings.Repeat("ü", 31)); len(n) > maxIdentLen {
		t.Fatalf("shared table name %q longer than %d bytes", n, maxIdentLen)
	}
	admin := adminPool(t)
	ctx := context.Background()
	schema := `Sch ema.` + randHex(3)
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+quote(schema)+" CASCADE")
	})
	for _, table := range []string{`Locks "Q" ü-` + randHex(3), strings.Repeat("l", 60) + randHex(1)} {
		d, err := Open(ctx, baseURL(t), WithSchema(schema), WithTable(table))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer d.Close()
		ch, cancel, err := d.Subscribe(ctx, "q/k")
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		for _, c := range []backend.Claim{permit("q/k", 2, time.Second), {Key: "q/k", Token: randHex(16), TTL: time.Second, Mode: backend.Write}} {
			g, err := d.TryAcquire(ctx, c)
			if err != nil {
				t.Fatalf("%s in %s: %v", c.Mode, d.SharedTableName(), err)
			}
			c.Fence = g.Fence
			if err := d.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ch:
			case <-time.After(5 * time.Second):
				t.Fatalf("no notification of the %s's release", c.Mode)
			}
		}
	}
}

// A session whose default isolation takes one snapshot per transaction
// (here serializable) still counts every holder granted while its grant
// waited for the object lock: the grant's transaction says READ COMMITTED.
// Here the grant that commits first is a row an admin transaction inserts
// while holding the object lock.
func TestSemaphoreGrantSeesGrantsItWaitedFor(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t, "options", "-cdefault_transaction_isolation=serializable")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "ns/waited"
	// The shared table, made by a first grant.
	first := permit(key, 1, time.Minute)
	g, err := d.TryAcquire(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	first.Fence = g.Fence
	if err := d.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	tx, err := h.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, h.sh.lock, h.sh.semClass, key); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := d.TryAcquire(ctx, permit(key, 1, time.Minute))
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("the grant did not wait for the object lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+h.sh.table+` (name, token, kind, lim, acquired_at, expires_at)
VALUES ($1, $2, 1, 1, clock_timestamp(), clock_timestamp() + interval '1 minute')`, key, randHex(16)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("grant after another one committed: %v, want ErrNotAcquired", err)
	}
}

// Under a session default of REPEATABLE READ, a grant statement sent
// without a transaction of its own would count holders in a snapshot
// older than the object's lock: it grants nothing then, and the driver
// runs its grants in explicit READ COMMITTED transactions. Permits from
// many goroutines never exceed the limit.
func TestGrantUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table := testTable(t, adminPool(t), "")
	cfg, err := pgxpool.ParseConfig(baseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	d, err := OpenConfig(ctx, cfg, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var iso string
	if err := d.pool.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("default_transaction_isolation = %q (%v), want repeatable read", iso, err)
	}
	const limit, workers, rounds = 2, 8, 15
	key := "ns/rr"
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Go(func() {
			for range rounds {
				c := backend.Claim{Key: key, Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: limit}
				g, err := d.TryAcquire(ctx, c)
				if errors.Is(err, backend.ErrNotAcquired) {
					continue
				}
				if err != nil {
					failed.Add(1)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				c.Fence = g.Fence
				if err := d.Release(ctx, c); err != nil {
					failed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d workers failed", n)
	}
	if m := most.Load(); m > limit || m == 0 {
		t.Fatalf("%d permits held at once, limit %d", m, limit)
	}
	if !d.explicitGrant.Load() {
		t.Fatal("grants did not move to explicit READ COMMITTED transactions")
	}
}
