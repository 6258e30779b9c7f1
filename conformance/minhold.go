package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// minHold: a lock released at once under MinHold stays held, for others,
// until the minimum has passed from its acquisition, however long its TTL;
// then it is free, the next fence is above, and the released Lock reports
// no loss.
func (s *suite) minHold(t *testing.T) {
	ctx := s.ctx(t)
	c, other := s.client(t), s.client(t)
	name := s.name(t, "x")
	mh := 2 * s.ttl()
	// MinHold counts from the grant, whose request went out after sent: a
	// time taken after the acquisition returned (late, on a loaded
	// machine) would put the checks past the minimum.
	sent := time.Now()
	// A TTL far past the minimum: the store must free the lock at the
	// minimum, not at the TTL.
	l := mustAcquire(t, ctx, c, name, locker.MinHold(mh), locker.TTL(3*mh))
	acquired := time.Now()
	mustRelease(t, ctx, l)

	// Until then, a grant to another client is early, judged by when it
	// was answered: one answered later came too late to tell, and the
	// lock is free.
	until := sent.Add(mh - backend.ClockMargin(mh) - 50*time.Millisecond)
	var n *locker.Lock
	for i := 0; n == nil && time.Now().Before(until) && i < 1000; i++ {
		got, err := other.TryAcquire(ctx, name)
		answered := time.Now()
		switch {
		case err == nil && answered.Before(until):
			got.Release(ctx)
			t.Fatalf("another client took the lock %v after its acquisition was sent, within MinHold %v: the holder released it within MinHold", answered.Sub(sent), mh)
		case err == nil:
			n = got
		case !errors.Is(err, locker.ErrNotAcquired):
			t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired (the holder released it within MinHold of its acquisition)", name, err)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n == nil {
		n = acquireWithin(t, ctx, other, name, time.Until(acquired.Add(mh+s.slack())))
	}
	defer n.Release(ctx)
	t.Logf("free %v after the acquisition (MinHold %v)", time.Since(acquired), mh)
	if n.Fence() != 0 && n.Fence() <= l.Fence() {
		t.Errorf("fence after MinHold = %d, not above the released holder's %d", n.Fence(), l.Fence())
	}
	notLost(t, l)
}
