package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A raised limit wakes a semaphore's waiter, as a release does: Resize
// publishes the release, and the waiter (who would look again only when
// the holder's minute runs out) gets in. A free semaphore reports its
// record as the limit, and Resize 0 deletes the record.
func TestResizeWakesAndLeavesNothing(t *testing.T) {
	d, admin := modalDriver(t)
	t.Parallel()
	ctx := testCtx(t)
	key := uniqueKey(t)
	sem := func() backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 1}
	}
	a, b := sem(), sem()
	if _, err := d.TryAcquire(ctx, a); err != nil {
		t.Fatal(err)
	}
	got := queueInBackground(t, ctx, d, d, b)
	sub := admin.Subscribe(ctx, keysFor(key).channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	if err := d.Resize(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := sub.ReceiveMessage(rctx); err != nil {
		t.Fatalf("no release published by Resize within 5s: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter after the limit was raised: %v", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted within 5s of the limit being raised")
	}
	for _, c := range []backend.Claim{a, b} {
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := d.Inspect(ctx, key, backend.Permit); err != nil || st.Held || st.Limit != 2 || !st.Known.Has(backend.KnowsLimit) {
		t.Errorf("Inspect of the free semaphore resized to 2 = %+v, %v; want Limit 2", st, err)
	}
	if err := d.Resize(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Inspect(ctx, key, backend.Permit); err != nil || st.Limit != 0 {
		t.Errorf("Inspect after Resize 0 = %+v, %v; want no limit", st, err)
	}
	rec := fairSharedKeys(a)[5]
	if n, err := admin.Exists(ctx, rec).Result(); err != nil || n != 0 {
		t.Errorf("the record %s after Resize 0: %d, %v; want gone", rec, n, err)
	}
}
