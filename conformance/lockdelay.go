package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// lockDelay: a lock lost without a release keeps its name from everyone
// for the delay after the loss, while its holder is told at the loss, as
// without the delay; a released one frees it at once. The loss is the
// TTL running out unrefreshed (a holder paused or cut off) or, where
// locks live in a session, the session's end (Harness.Expire): the
// driver's marker must outlive it by the delay (backend.Delayer).
func (s *suite) lockDelay(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	delay := s.ttl()
	start := time.Now()
	l, err := c1.TryAcquire(ctx, name, locker.AutoRefresh(false), locker.LockDelay(delay))
	if errors.Is(err, locker.ErrUnsupported) && s.isSession(c1) {
		t.Skip("the driver's locks live in a session, and it keeps no marker past the session's end: not a backend.Delayer")
	}
	if err != nil {
		t.Fatalf("TryAcquire with LockDelay: %v", err)
	}
	lost := start.Add(l.TTL()) // when the store may drop the lock itself
	if s.isSession(c1) {
		lost = time.Now()
		if err := s.h.Expire(ctx, s.key(name)); err != nil {
			t.Fatalf("Harness.Expire: %v", err)
		}
	}
	waitLost(t, l, time.Until(lost)+s.slack(), "the lock was lost without a release")
	if late := time.Since(lost); late > delay/2 {
		t.Fatalf("Lost fired %v after the loss: the delay must not postpone the holder's own signal", late)
	}
	l2 := acquireWithin(t, ctx, c2, name, time.Until(lost)+delay+s.sessionSlack(c1)+s.slack())
	if early := lost.Add(delay).Sub(time.Now()); early > 0 {
		t.Fatalf("the name was granted again %v before the delay (%v) after the loss had passed", early, delay)
	}
	// A release frees the name at once, delay or not.
	mustRelease(t, ctx, l2)
	l3 := mustAcquire(t, ctx, c1, name, locker.LockDelay(time.Hour))
	mustRelease(t, ctx, l3)
	mustRelease(t, ctx, mustAcquire(t, ctx, c2, name))
}

// sessionSlack is how much later than the delay after a session's end a
// Delayer may free the name: its marker may count from the session's last
// contact, up to a session timeout before its end was known.
func (s *suite) sessionSlack(c *locker.Client) time.Duration {
	if d, ok := backend.As[backend.Session](c.Driver()); ok {
		return d.SessionTTL()
	}
	return 0
}
