package testutil

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// SetRoundTrips takes a set of 4 free keys with d, finds it held with a
// second set, releases it, and returns the requests that each step sent,
// read from sent, a count kept on d's connections: 1 each where a set
// costs the round trips of one name. The first call also finds what d
// makes ready on first use.
func SetRoundTrips(t testing.TB, ctx context.Context, d backend.SetAcquirer, sent func() int64) (acquire, refused, release int64) {
	t.Helper()
	claims := func() []backend.Claim {
		cs := make([]backend.Claim, 4)
		for i := range cs {
			cs[i] = backend.Claim{Key: "rt/" + string(rune('a'+i)), Token: Token(), TTL: time.Minute}
		}
		return cs
	}
	cs := claims()
	n := sent()
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil {
		t.Fatalf("TryAcquireAll: %v", err)
	}
	acquire = sent() - n
	if _, err := d.TryAcquireAll(ctx, claims()); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll of a held set: %v, want ErrNotAcquired", err)
	}
	refused = sent() - n - acquire
	for i := range cs {
		cs[i].Fence = gs[i].Fence
	}
	n = sent()
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	return acquire, refused, sent() - n
}
