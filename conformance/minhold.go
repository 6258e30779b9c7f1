package conformance

import (
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
	// A TTL far past the minimum: the store must free the lock at the
	// minimum, not at the TTL.
	l := mustAcquire(t, ctx, c, name, locker.MinHold(mh), locker.TTL(3*mh))
	acquired := time.Now()
	mustRelease(t, ctx, l)

	until := acquired.Add(mh - backend.ClockMargin(mh) - 50*time.Millisecond)
	for n := 0; time.Now().Before(until) && n < 1000; n++ {
		mustRefuse(t, ctx, other, name, "the holder released it within MinHold of its acquisition")
		time.Sleep(50 * time.Millisecond)
	}
	n := acquireWithin(t, ctx, other, name, time.Until(acquired.Add(mh+s.slack())))
	defer n.Release(ctx)
	t.Logf("free %v after the acquisition (MinHold %v)", time.Since(acquired), mh)
	if n.Fence() != 0 && n.Fence() <= l.Fence() {
		t.Errorf("fence after MinHold = %d, not above the released holder's %d", n.Fence(), l.Fence())
	}
	notLost(t, l)
}
