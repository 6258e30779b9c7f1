package conformance

import (
	"testing"
	"time"
)

// forgetsReleased: Traits.Retention after its last release, the store
// keeps nothing of a name, and the name's next fence is still above every
// earlier one.
func (s *suite) forgetsReleased(t *testing.T) {
	rc, ok := s.h.(ResidueCounter)
	if !ok {
		t.Skip("the harness does not implement ResidueCounter: it cannot count what the store keeps")
	}
	ctx := s.ctx(t)
	c := s.client(t)
	name := s.name(t, "x")
	key := s.key(name)
	var last uint64
	for round := range 2 {
		l := mustAcquire(t, ctx, c, name)
		if l.Fence() != 0 && l.Fence() <= last {
			t.Fatalf("round %d: fence %d after the store forgot the name, not above the earlier %d", round, l.Fence(), last)
		}
		last = l.Fence()
		if n, err := rc.Residue(ctx, key); err != nil || n == 0 {
			// Proves that Residue sees the name at all.
			t.Fatalf("round %d: Residue while held = %d (err %v), want at least the lock", round, n, err)
		}
		mustRelease(t, ctx, l)
		deadline := time.Now().Add(s.tr.Retention + s.slack())
		for {
			n, err := rc.Residue(ctx, key)
			if err != nil {
				t.Fatalf("Residue: %v", err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d entries of the name remain %v after its release; the retention is %v", round, n, s.tr.Retention+s.slack(), s.tr.Retention)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
