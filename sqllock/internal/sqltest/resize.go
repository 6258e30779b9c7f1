package sqltest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// Resizer is a dialect's driver, as ResizeRecord uses it.
type Resizer interface {
	backend.Driver
	backend.Inspector
	backend.Resizer
}

// ResizeRecord checks that key's limit record stands on a free semaphore
// too, judges claims under any limit, outlives its holders and that no
// claim's token takes it; and that Resize 0 leaves nothing of the name,
// as rows (the count of key's rows in the shared table) says.
func ResizeRecord(t *testing.T, ctx context.Context, d Resizer, key string, rows func() (int, error)) {
	t.Helper()
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
	if n, err := rows(); err != nil || n != 0 {
		t.Fatalf("rows of the name after Resize 0 = %d, %v; want 0", n, err)
	}
}
