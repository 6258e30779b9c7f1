package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A set is one statement: all of its keys or none, with an expired or
// the token's own row taken again, and a partial take undone.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	d, _ := testDriver(t)
	ctx := context.Background()
	set := func(keys ...string) []backend.Claim {
		cs := make([]backend.Claim, len(keys))
		for i, k := range keys {
			cs[i] = backend.Claim{Key: k, Token: randHex(16), TTL: time.Minute, Owner: "set"}
		}
		return cs
	}
	cs := set("s/a", "s/b", "s/c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("TryAcquireAll of free keys: %v %v", gs, err)
	}
	for i, g := range gs {
		if g.Fence == 0 || g.TTL != time.Minute {
			t.Fatalf("grant %d: %+v", i, g)
		}
		cs[i].Fence = g.Fence
	}
	// c's TTL runs out: a set over it takes it; b is held: that set is
	// refused whole, and its free key d stays free.
	short := set("s/x")[0]
	short.Key, short.TTL = "s/y", time.Millisecond
	if _, err := d.TryAcquire(ctx, short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	refused := set("s/b", "s/d")
	if _, err := d.TryAcquireAll(ctx, refused); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held key: %v, want ErrNotAcquired", err)
	}
	if st, err := d.Inspect(ctx, "s/d", backend.Exclusive); err != nil || st.Held {
		t.Fatalf("s/d after the refused set: %+v %v, want free (the statement undone)", st, err)
	}
	over := set("s/d", "s/y")
	if gs, err := d.TryAcquireAll(ctx, over); err != nil || gs[1].Fence <= 0 {
		t.Fatalf("TryAcquireAll over an expired key: %v %v", gs, err)
	}
	// Released in one round trip: each key freed, a second release is
	// not held.
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("second ReleaseAll %s: %v, want ErrNotHeld", cs[i].Key, err)
		}
	}
	if gs, err := d.TryAcquireAll(ctx, set("s/a", "s/b", "s/c")); err != nil || gs[0].Fence <= cs[0].Fence {
		t.Fatalf("TryAcquireAll after the release: %v %v, want fences above the first set's", gs, err)
	}
}
