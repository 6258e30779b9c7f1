package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// Holders above a lowered limit hold as Inspect and Break see them (the
// record keeps the last node that held), claims under any limit are
// judged under the record's; once it is removed while it holds permits
// the claims' own limits would not grant, a record with no limit keeps
// them, and the first claim after them deletes it; Resize 0 of a name
// never resized makes nothing.
func TestResizeKeepsHolders(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, ops := dial(t, servers), dial(t, servers)
	key := uniqueKey(t)
	record := d.queueParent(backend.Claim{Key: key, Mode: backend.Permit}) + "/" + resizeName
	take := func(limit, weight int) (backend.Claim, error) {
		c := sharedClaim(t, key, backend.Permit, limit)
		c.Weight = weight
		g, err := d.TryAcquire(ctx, c)
		c.Fence = g.Fence
		return c, err
	}
	inspect := func(what string, holders, limit int) {
		t.Helper()
		st, err := ops.Inspect(ctx, key, backend.Permit)
		if err != nil || len(st.Holders) != holders || st.Limit != limit {
			t.Fatalf("%s: Inspect = %+v, %v; want %d holders and limit %d", what, st, err, holders, limit)
		}
	}

	var held []backend.Claim
	for range 3 {
		c, err := take(3, 1)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if err := ops.Resize(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	inspect("3 holders, lowered to 2", 3, 2)
	if _, err := ops.Break(ctx, key, backend.Permit, held[2].Fence); err != nil {
		t.Fatalf("Break of the holder above the lowered limit: %v", err)
	}
	for _, limit := range []int{3, 5} {
		if _, err := take(limit, 1); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("a claim of %d with 2 held, lowered to 2: %v, want ErrNotAcquired", limit, err)
		}
	}
	if _, err := take(3, 3); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("3 permits of a semaphore lowered to 2: %v, want ErrLimitMismatch", err)
	}

	if err := ops.Resize(ctx, key, 4); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c, err := take(1, 1) // granted under 4, not under its own 1
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if err := ops.Resize(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	inspect("4 holders, 2 of them granted under the record, removed", 4, 3)
	if ok, _, err := ops.conn.Exists(record); err != nil || !ok {
		t.Fatalf("the record while its holders hold: there %v, %v", ok, err)
	}
	for _, c := range append(held[:2], held[3:]...) {
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	c, err := take(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := ops.conn.Exists(record); err != nil || ok {
		t.Fatalf("the record after the first claim after its holders: there %v, %v", ok, err)
	}
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}

	fresh := uniqueKey(t)
	if err := ops.Resize(ctx, fresh, 0); err != nil {
		t.Fatal(err)
	}
	parent := ops.queueParent(backend.Claim{Key: fresh, Mode: backend.Permit})
	if ok, _, err := ops.conn.Exists(parent); err != nil || ok {
		t.Fatalf("Resize 0 of a name never resized made its node: %v, %v", ok, err)
	}
	if err := ops.Resize(ctx, fresh, 2); err != nil {
		t.Fatal(err)
	}
	inspect2, err := ops.Inspect(ctx, fresh, backend.Permit)
	if err != nil || inspect2.Held || inspect2.Limit != 2 {
		t.Fatalf("Inspect of a free semaphore resized to 2 = %+v, %v", inspect2, err)
	}
	if err := ops.Resize(ctx, fresh, 0); err != nil {
		t.Fatal(err)
	}
	if names, _, err := ops.conn.Children(parent); err != nil || len(names) != 0 {
		t.Fatalf("after Resize 0 of a free semaphore: children %v, %v; want none", names, err)
	}
}
