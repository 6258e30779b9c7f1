package etcdlock

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestMinHoldOutlivesTheDriver: a lock released within MinHold stays held
// after its Client closes (Close revokes the session's leases), because it
// moved to a lease of its own; etcd frees it when that lease runs out.
func TestMinHoldOutlivesTheDriver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 60*time.Second)
	a, _ := h.client(t)
	b, _ := h.client(t)
	const mh = 4 * time.Second
	// Before the request: MinHold counts from the grant, after it (a time
	// taken once TryAcquire returned is later by a loaded machine's round
	// trip, and put the checks below past the minimum).
	acquired := time.Now()
	l, err := a.TryAcquire(ctx, "min-hold", locker.MinHold(mh))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release within MinHold: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st, err := b.Inspect(ctx, "min-hold")
	if err != nil || !st.Held || st.Fence != l.Fence() {
		t.Fatalf("Inspect after the holder's Release and Close = %+v, %v; want held under fence %d", st, err, l.Fence())
	}
	for n := 0; time.Since(acquired) < mh-time.Second && n < 100; n++ {
		if _, err := b.TryAcquire(ctx, "min-hold"); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire %v after the acquisition, within MinHold %v, after the holder closed = %v, want ErrNotAcquired", time.Since(acquired), mh, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, err := b.Acquire(testCtx(t, mh+5*time.Second), "min-hold")
	if err != nil {
		t.Fatalf("Acquire after MinHold: %v", err)
	}
	took := time.Since(acquired)
	t.Logf("free %v after the acquisition (MinHold %v)", took, mh)
	if took < mh-time.Second/10 {
		t.Errorf("free after %v, before MinHold %v", took, mh)
	}
	if n.Fence() <= l.Fence() {
		t.Errorf("fence %d after MinHold, not above %d", n.Fence(), l.Fence())
	}
}
