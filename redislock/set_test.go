package redislock

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A set on one server is one script: every name or none, each with its
// own fence; the release is one pipeline.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	d := openDriver(t)
	ctx := testCtx(t)
	ns := "set-" + newToken()[:8]
	set := func(names ...string) []backend.Claim {
		cs := make([]backend.Claim, len(names))
		for i, n := range names {
			cs[i] = backend.Claim{Key: ns + "/" + n, Token: newToken(), TTL: time.Minute, Owner: "set"}
		}
		return cs
	}
	cs := set("a", "b", "c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("TryAcquireAll of free names: %v %v", gs, err)
	}
	for i, g := range gs {
		if g.Fence == 0 || g.TTL != time.Minute {
			t.Fatalf("grant %d: %+v", i, g)
		}
		cs[i].Fence = g.Fence
	}
	other := set("c", "d")
	if _, err := d.TryAcquireAll(ctx, other); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held name: %v, want ErrNotAcquired", err)
	}
	if st, err := d.Inspect(ctx, other[1].Key, backend.Exclusive); err != nil || st.Held {
		t.Fatalf("%s after the refused set: %+v %v, want free", other[1].Key, st, err)
	}
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
	again := set("a", "b", "c")
	gs2, err := d.TryAcquireAll(ctx, again)
	if err != nil || gs2[0].Fence <= gs[0].Fence {
		t.Fatalf("TryAcquireAll after the release: %v %v, want fences above the first set's", gs2, err)
	}
	for i := range again {
		again[i].Fence = gs2[i].Fence
	}
	for _, err := range d.ReleaseAll(ctx, again) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The fair mode takes sets name by name.
	fair, err := OpenFair(ctx, "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer fair.Close()
	if _, err := fair.TryAcquireAll(ctx, set("x", "y")); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("fair TryAcquireAll: %v, want ErrUnsupported", err)
	}
}
