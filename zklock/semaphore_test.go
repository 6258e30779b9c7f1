package zklock

import "testing"

// TestPermitStanding: a node holds while the permits of the nodes ahead
// and its own fit the limit; the first node's limit rules.
func TestPermitStanding(t *testing.T) {
	ahead := []snode{{tag: permitTag(5, 1), seq: 2}, {tag: permitTag(5, 3), seq: 1}}
	for _, c := range []struct {
		weight int
		held   bool
	}{{1, true}, {2, false}} {
		if st := permitStanding(ahead, 5, c.weight); st.mismatch != nil || st.held != c.held {
			t.Errorf("%d of 5 behind 3 and 1: held %v (%v), want %v", c.weight, st.held, st.mismatch, c.held)
		}
	}
	if st := permitStanding(ahead, 4, 1); st.mismatch == nil {
		t.Errorf("a permit of 4 behind permits of 5: no ErrLimitMismatch")
	}
}
