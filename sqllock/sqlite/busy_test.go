package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// While another connection holds the database's write lock (BEGIN
// EXCLUSIVE, as a long write of another process would), writes fail
// within the busy timeout, or the caller's ctx, as "could not tell":
// never as not acquired, never hanging. Reads go on (WAL). Once the
// write lock is free, everything works.
func TestBusyDatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "locks.db")
	ctx := context.Background()
	d, err := Open(ctx, "sqlite://"+path+"?busy_timeout=300ms")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	held := backend.Claim{Key: "ns/held", Token: testutil.Token(), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, held); err != nil {
		t.Fatal(err)
	}

	other := sqltest.SQLiteDB(t, path)
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	locked := true
	defer func() {
		if locked {
			conn.ExecContext(ctx, "ROLLBACK")
		}
	}()

	// couldNotTell checks err and how long its call took.
	couldNotTell := func(what string, took, within time.Duration, err error) {
		t.Helper()
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		switch {
		case err == nil:
			t.Errorf("%s succeeded while the database was locked", what)
		case errors.Is(err, backend.ErrNotAcquired) || errors.Is(err, backend.ErrNotHeld):
			t.Errorf("%s = %v: a busy database is no answer", what, err)
		case backend.Permanent(err):
			t.Errorf("%s = %v: want a non-permanent error", what, err)
		}
		if took > within {
			t.Errorf("%s took %v, want at most %v", what, took, within)
		}
	}
	// Bounded by the busy timeout (300ms, so the pragma reached the
	// connection), then by the caller's ctx.
	start := time.Now()
	_, err = d.TryAcquire(ctx, backend.Claim{Key: "ns/a", Token: testutil.Token(), TTL: time.Minute})
	couldNotTell("TryAcquire", time.Since(start), 3*time.Second, err)
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("TryAcquire gave up after %v: the busy timeout is 300ms", took)
	}
	start = time.Now()
	_, err = d.TryAcquire(ctx, backend.Claim{Key: "ns/s", Token: testutil.Token(), TTL: time.Minute, Mode: backend.Permit, Limit: 2})
	couldNotTell("TryAcquire of a permit (a transaction)", time.Since(start), 3*time.Second, err)
	start = time.Now()
	err = d.Refresh(ctx, held)
	couldNotTell("Refresh", time.Since(start), 3*time.Second, err)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	start = time.Now()
	err = d.Release(cctx, held)
	cancel()
	couldNotTell("Release with a 100ms ctx", time.Since(start), 100*time.Millisecond+backend.CancelGrace+time.Second, err)

	// Reads do not wait for the writer.
	start = time.Now()
	if st, err := d.Inspect(ctx, held.Key, backend.Exclusive); err != nil || !st.Held {
		t.Errorf("Inspect while locked = %+v, %v: want the lock, held", st, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Inspect took %v while another connection wrote", took)
	}

	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	locked = false
	if err := d.Refresh(ctx, held); err != nil {
		t.Fatalf("Refresh after the lock ended: %v", err)
	}
	if err := d.Release(ctx, held); err != nil {
		t.Fatalf("Release after the lock ended: %v", err)
	}
	// The abandoned acquisition of ns/a may still be undoing itself: wait
	// for the name as a client would.
	c, err := locker.New(d, locker.WithNamespace("ns"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := c.Acquire(wctx, "a", locker.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire after the lock ended: %v", err)
	}
	l.Release(ctx)
}
