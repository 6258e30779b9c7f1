package sqllock

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// baseURL returns the test database's URL, or skips (fails in CI) when the
// server is not running.
func baseURL(t testing.TB) string {
	t.Helper()
	testenv.Require(t, testenv.PostgresAddr())
	return testenv.PostgresURL()
}

var (
	randHex    = testutil.RandHex
	withParams = sqltest.WithParams
)

// adminPool is a pool for the test's own statements, closed at cleanup.
func adminPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, baseURL(t))
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testTable returns a table name unique to this run, and drops the table
// (and schema, if given) at cleanup: other tests share the database.
func testTable(t testing.TB, admin *pgxpool.Pool, schema string) string {
	t.Helper()
	table := "locks_" + randHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d := newStatements(schema, table)
		sh := newSharedStatements(schema, table)
		if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+d.table+", "+sh.table); err != nil {
			t.Errorf("drop %s: %v", d.table, err)
		}
		if schema != "" {
			if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+quote(schema)); err != nil {
				t.Errorf("drop schema %s: %v", schema, err)
			}
		}
	})
	return table
}

func quote(s string) string { return newStatements("", s).table }

// harness runs the conformance suite on one table of the test database.
type harness struct {
	t     *testing.T
	url   string // with lock_table
	admin *pgxpool.Pool
	sql   statements
	sh    sharedStatements
}

func newHarness(t *testing.T, params ...string) *harness {
	admin := adminPool(t)
	table := testTable(t, admin, "")
	return &harness{
		t:     t,
		url:   withParams(t, baseURL(t), append([]string{paramTable, table, "application_name", "sqllock-conformance"}, params...)...),
		admin: admin,
		sql:   newStatements("", table),
		sh:    newSharedStatements("", table),
	}
}

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, h.url)
}

// Expire moves the lock's expiry into the past, by the server's clock, as
// its TTL running out would.
func (h *harness) Expire(ctx context.Context, key string) error {
	var n int64
	expire := `WITH e AS (
    UPDATE ` + h.sql.table + ` SET expires_at = clock_timestamp() - interval '1 millisecond'
    WHERE name = $1 RETURNING name
), ` + notifyKeyCTE(h.sql.table) + `
SELECT count(*) FROM e LEFT JOIN k ON true, pg_notify($2, ` + payloadSQL("e.name") + `)`
	if err := h.admin.QueryRow(ctx, expire, key, h.sql.channel).Scan(&n); err != nil {
		return err
	}
	if n != 1 {
		return errors.New("no lock to expire on " + key)
	}
	return nil
}

// Entries counts the live holders of key: 0 or 1 for the lock (the row of
// an expired lock stays until it is taken or released, but holds
// nothing), and the live rows of its semaphore and read-write lock.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	var n int
	err := h.admin.QueryRow(ctx, `SELECT count(*) FROM `+h.sql.table+
		` WHERE name = $1 AND token IS NOT NULL AND expires_at > clock_timestamp()`, key).Scan(&n)
	if err != nil {
		return 0, err
	}
	m, err := h.sharedRows(ctx, key, ` AND expires_at > clock_timestamp()`)
	return n + m, err
}

// Residue counts the key's rows: the lock's, and those of its semaphore
// and read-write lock (the fence counters are the tables' sequences, the
// notification key's row is no lock's).
func (h *harness) Residue(ctx context.Context, key string) (int, error) {
	var n int
	err := h.admin.QueryRow(ctx, `SELECT count(*) FROM `+h.sql.table+` WHERE name = $1`, key).Scan(&n)
	if err != nil {
		return 0, err
	}
	m, err := h.sharedRows(ctx, key, "")
	return n + m, err
}

// sharedRows counts key's rows in the shared table (holders of permits,
// readers, writers, and waiting writers' records) that meet cond; none
// while the table does not exist (no semaphore used yet).
func (h *harness) sharedRows(ctx context.Context, key, cond string) (int, error) {
	var exists bool
	if err := h.admin.QueryRow(ctx, h.sql.exists, h.sh.table).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var n int
	err := h.admin.QueryRow(ctx, `SELECT count(*) FROM `+h.sh.table+` WHERE name = $1`+cond, key).Scan(&n)
	return n, err
}

// rowCount is Residue for a test.
func rowCount(t *testing.T, h *harness, key string) int {
	t.Helper()
	n, err := h.Residue(context.Background(), key)
	if err != nil {
		t.Fatalf("count the rows of %s: %v", key, err)
	}
	return n
}

// NewCutDriver opens a driver whose pool (and listener) dial the server
// through a proxy of its own, the switch.
func (h *harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	p, err := faultproxy.New(testenv.PostgresAddr())
	if err != nil {
		return nil, nil, err
	}
	h.t.Cleanup(func() { p.Close() })
	u, err := url.Parse(h.url)
	if err != nil {
		return nil, nil, err
	}
	u.Host = p.Addr()
	d, err := Open(ctx, u.String())
	if err != nil {
		return nil, nil, err
	}
	down := func(on bool) {
		p.Refuse(on)
		if on {
			p.Cut()
		}
	}
	return d, down, nil
}

func (h *harness) Traits() conformance.Traits {
	// Expiry is exact to the microsecond, on the server's clock; a
	// release deletes the key's row.
	return conformance.Traits{TTL: 500 * time.Millisecond, Retention: 0}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

// The simple protocol, as behind PgBouncer in transaction mode: every
// statement works without prepared statements.
func TestConformanceSimpleProtocol(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole suite again")
	}
	conformance.Run(t, newHarness(t, "default_query_exec_mode", "simple_protocol"))
}

// testDriver opens a driver on a fresh table.
func testDriver(t *testing.T, params ...string) (*Driver, *harness) {
	t.Helper()
	h := newHarness(t, params...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d, h
}

func TestAcquireRefreshRelease(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx := context.Background()
	a := backend.Claim{Key: "ns/a b/ü/..", Token: randHex(16), TTL: 1500 * time.Nanosecond, Owner: "job-1"}
	g, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if g.Fence == 0 || g.TTL != 2*time.Microsecond {
		t.Fatalf("grant %+v, want a fence and TTL 2µs (rounded up)", g)
	}
	first := g.Fence
	time.Sleep(time.Millisecond)
	// Expired: refresh and release say not held, and anyone may take it.
	a.Fence = g.Fence
	if err := d.Refresh(ctx, a); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Refresh of an expired lock = %v, want ErrNotHeld", err)
	}
	if err := d.Release(ctx, a); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of an expired lock = %v, want ErrNotHeld", err)
	}
	b := backend.Claim{Key: a.Key, Token: randHex(16), TTL: time.Minute, Owner: "job-2"}
	g, err = d.TryAcquire(ctx, b)
	if err != nil || g.Fence <= first {
		t.Fatalf("TryAcquire after expiry = %+v, %v, want a fence above %d", g, err, first)
	}
	b.Fence = g.Fence
	info, err := d.Inspect(ctx, b.Key, backend.Exclusive)
	if err != nil || !info.Held || info.Owner != "job-2" || info.Fence != b.Fence || info.TTL < 50*time.Second || info.TTL > time.Minute {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	c := backend.Claim{Key: a.Key, Token: randHex(16), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock = %v, want ErrNotAcquired", err)
	}
	// Same token again (a retried statement): still its, with a new fence.
	stale := b
	if g, err := d.TryAcquire(ctx, b); err != nil || g.Fence <= b.Fence {
		t.Fatalf("TryAcquire again by the holder = %+v, %v, want a fence above %d", g, err, b.Fence)
	} else {
		b.Fence = g.Fence
	}
	if err := d.Refresh(ctx, b); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := d.Refresh(ctx, stale); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Refresh with a stale fence = %v, want ErrNotHeld", err)
	}
	if err := d.Release(ctx, b); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := d.Release(ctx, b); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	// The release deleted the row; the fence goes on, from the table's
	// sequence.
	if n := rowCount(t, h, a.Key); n != 0 {
		t.Fatalf("%d rows of the key after its release, want none", n)
	}
	if g, err := d.TryAcquire(ctx, c); err != nil || g.Fence <= b.Fence {
		t.Fatalf("TryAcquire after release = %+v, %v, want a fence above %d", g, err, b.Fence)
	}
	if info, err := d.Inspect(ctx, "never/locked", backend.Exclusive); err != nil || info.Held || info.Key != "never/locked" {
		t.Fatalf("Inspect of an unknown key = %+v, %v", info, err)
	}
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: "k", Token: randHex(16)}); !errors.Is(err, backend.ErrInvalidTTL) {
		t.Fatalf("TryAcquire with TTL 0 = %v, want ErrInvalidTTL", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if err := d.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
}

// Expiry is the server's business: the driver keeps no client clock, Inspect
// reports the time left by the server's clock, and another driver takes the
// lock just after its TTL.
func TestExpiryIsTheServers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	const ttl = 700 * time.Millisecond
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	other, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	key := "expiry/" + randHex(8)
	start := time.Now()
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: ttl}); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	// At most the TTL remains, and at least what start leaves of it (the
	// grant came after start; the two round trips may take a loaded
	// machine long), less 50ms for rounding.
	info, err := d.Inspect(ctx, key, backend.Exclusive)
	if least := ttl - time.Since(start) - 50*time.Millisecond; err != nil || !info.Held || info.TTL > ttl || info.TTL < least {
		t.Fatalf("Inspect = %+v, %v: want between %v and %v remaining", info, err, least, ttl)
	}
	// Held until the TTL passes on the server, then free.
	var took time.Duration
	for {
		_, err := other.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: ttl})
		if err == nil {
			took = time.Since(start)
			break
		}
		if !errors.Is(err, backend.ErrNotAcquired) || time.Since(start) > 5*time.Second {
			t.Fatalf("TryAcquire by another: %v after %v", err, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if took < ttl || took > ttl+time.Second {
		t.Fatalf("the lock freed after %v, want just over %v", took, ttl)
	}
}

func TestRefreshMany(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testRefreshMany(t, mode)
		})
	}
}

func testRefreshMany(t *testing.T, mode string) {
	d, h := testDriver(t, "default_query_exec_mode", mode)
	ctx := context.Background()
	var held []backend.Claim
	for i := range 5 {
		l := backend.Claim{Key: "many/" + string(rune('a'+i)), Token: randHex(16), TTL: 300 * time.Millisecond}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		l.Fence = g.Fence
		held = append(held, l)
	}
	if err := h.Expire(ctx, held[3].Key); err != nil {
		t.Fatal(err)
	}
	forged := held[1]
	forged.Token = randHex(16)
	stale := held[2]
	stale.Fence++
	bad := held[4]
	bad.TTL = 0
	batch := []backend.Claim{held[0], forged, stale, held[3], bad, held[1], {Key: "many/none", Token: randHex(16), TTL: time.Second}}
	for i := range batch {
		if batch[i].TTL > 0 {
			batch[i].TTL = 5 * time.Second
		}
	}
	errs := d.RefreshMany(ctx, batch)
	want := []error{nil, backend.ErrNotHeld, backend.ErrNotHeld, backend.ErrNotHeld, backend.ErrInvalidTTL, nil, backend.ErrNotHeld}
	if len(errs) != len(want) {
		t.Fatalf("%d results for %d locks", len(errs), len(batch))
	}
	for i := range want {
		if (want[i] == nil) != (errs[i] == nil) || want[i] != nil && !errors.Is(errs[i], want[i]) {
			t.Errorf("lock %d: %v, want %v", i, errs[i], want[i])
		}
	}
	time.Sleep(500 * time.Millisecond) // past the original TTL: only the refreshed live on
	for i, l := range held {
		info, err := d.Inspect(ctx, l.Key, backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		if wantHeld := i == 0 || i == 1; info.Held != wantHeld {
			t.Errorf("lock %d held %v, want %v", i, info.Held, wantHeld)
		}
	}
}

// Holders of one name, acquiring and releasing as fast as they can from
// several drivers, get fences that increase in the order they held it,
// though every release deletes the row the next acquisition inserts again.
func TestFencesIncreaseAcrossReleases(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		fences []uint64
	)
	const workers, rounds = 4, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		d, err := Open(ctx, h.url)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for got := 0; got < rounds; {
				l := backend.Claim{Key: "ns/hot", Token: randHex(16), TTL: 10 * time.Second}
				g, err := d.TryAcquire(ctx, l)
				if errors.Is(err, backend.ErrNotAcquired) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				fences = append(fences, g.Fence)
				mu.Unlock()
				l.Fence = g.Fence
				if err := d.Release(ctx, l); err != nil {
					errs <- err
					return
				}
				got++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("holder %d got fence %d after %d", i, fences[i], fences[i-1])
		}
	}
	if len(fences) != workers*rounds {
		t.Fatalf("%d acquisitions, want %d", len(fences), workers*rounds)
	}
}

// A release waits for an acquisition of the same name in flight, one that
// has drawn its fence but not yet looked for the row (here, a transaction
// that holds the name's fence lock shared, as the acquire statement does
// from before its draw to its end): so the row it deletes cannot be one
// the acquisition then misses, with a fence above the one it drew.
func TestReleaseWaitsForAcquisitionInFlight(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := backend.Claim{Key: "ns/inflight", Token: randHex(16), TTL: time.Minute}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	l.Fence = g.Fence
	tx, err := h.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1, hashtext($2))`, h.sql.fenceClass, l.Key); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- d.Release(ctx, l) }()
	select {
	case err := <-released:
		t.Fatalf("Release returned (%v) while an acquisition of the name was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// And an acquisition waits for a release of the same name in flight (here,
// a transaction that holds the name's fence lock exclusively, as the
// release statement does before it deletes the row) before it draws its
// fence.
func TestAcquisitionWaitsForReleaseInFlight(t *testing.T) {
	t.Parallel()
	d, h := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := backend.Claim{Key: "ns/inflight", Token: randHex(16), TTL: time.Minute}
	tx, err := h.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, h.sql.fenceClass, l.Key); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := d.TryAcquire(ctx, l)
		acquired <- err
	}()
	select {
	case err := <-acquired:
		t.Fatalf("TryAcquire returned (%v) while a release of the name was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-acquired; err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
}

// List matches its prefix literally (LIKE's wildcards and escape in it
// match themselves), and leaves out the notification key's row, which
// looks held forever.
func TestListPrefixIsLiteral(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	keys := []string{`lk/a_b`, `lk/axb`, `lk/a%`, `lk/ay`, `lk/a\`, `lk/a\b`}
	for _, k := range keys {
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: k, Token: randHex(16), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string][]string{
		`lk/a_`: {`lk/a_b`},
		`lk/a%`: {`lk/a%`},
		`lk/a\`: {`lk/a\`, `lk/a\b`},
		``:      {`lk/a%`, `lk/a\`, `lk/a\b`, `lk/a_b`, `lk/axb`, `lk/ay`},
	} {
		got, err := d.List(ctx, prefix, backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, st := range got {
			names = append(names, st.Key)
		}
		if !slices.Equal(names, want) {
			t.Errorf("List(%q) = %q, want %q", prefix, names, want)
		}
	}
	// The Client names the operation: the driver says only what it found.
	if _, err := d.Break(ctx, keys[0], backend.Exclusive, 1<<40); !errors.Is(err, backend.ErrNotHeld) || err.Error() != "sqllock: not held" {
		t.Errorf("Break under another fence = %v, want ErrNotHeld", err)
	}
}
