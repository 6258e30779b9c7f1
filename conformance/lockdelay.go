package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// lockDelay: a lock lost without a release (here, its TTL ran out
// unrefreshed: a holder paused or cut off) keeps its name from everyone
// for the delay after its expiry, while its holder is told at the TTL, as
// without the delay; a released one frees it at once.
func (s *suite) lockDelay(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	delay := s.ttl()
	start := time.Now()
	l, err := c1.TryAcquire(ctx, name, locker.AutoRefresh(false), locker.LockDelay(delay))
	if errors.Is(err, locker.ErrUnsupported) && s.isSession(c1) {
		t.Skip("the driver is a backend.Session: its locks end with the session, which no delay outlives")
	}
	if err != nil {
		t.Fatalf("TryAcquire with LockDelay: %v", err)
	}
	waitLost(t, l, l.TTL()+s.slack(), "the TTL ran out without a refresh")
	if lost := time.Since(start); lost > l.TTL()+delay/2 {
		t.Fatalf("Lost fired %v after the acquisition: the delay must not postpone the holder's own signal (TTL %v)", lost, l.TTL())
	}
	l2 := acquireWithin(t, ctx, c2, name, l.TTL()+delay+s.slack())
	if took := time.Since(start); took < l.TTL()+delay {
		t.Fatalf("the name was granted again %v after the acquisition, before the TTL (%v) and the delay (%v) had passed", took, l.TTL(), delay)
	}
	// A release frees the name at once, delay or not.
	mustRelease(t, ctx, l2)
	l3 := mustAcquire(t, ctx, c1, name, locker.LockDelay(time.Hour))
	mustRelease(t, ctx, l3)
	mustRelease(t, ctx, mustAcquire(t, ctx, c2, name))
}
