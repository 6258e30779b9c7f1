package zklock

import "testing"

// TestPermitStanding: a node holds while the permits of the nodes ahead
// and its own fit the limit; the first node's limit rules, unless a
// resize record does: then the nodes that held when it was written hold,
// and the others fit its limit, whatever theirs.
func TestPermitStanding(t *testing.T) {
	ahead := []snode{{tag: permitTag(5, 1), seq: 2}, {tag: permitTag(5, 3), seq: 1}}
	for _, c := range []struct {
		weight int
		held   bool
	}{{1, true}, {2, false}} {
		if st := permitStanding(ahead, 3, nil, 5, c.weight); st.mismatch != nil || st.held != c.held {
			t.Errorf("%d of 5 behind 3 and 1: held %v (%v), want %v", c.weight, st.held, st.mismatch, c.held)
		}
	}
	if st := permitStanding(ahead, 3, nil, 4, 1); st.mismatch == nil {
		t.Errorf("a permit of 4 behind permits of 5: no ErrLimitMismatch")
	}
	for _, c := range []struct {
		r      resized
		seq    int64
		weight int
		held   bool
	}{
		{resized{limit: 5, upto: -1}, 3, 1, true},
		{resized{limit: 4, upto: -1}, 3, 1, false},
		{resized{limit: 4, upto: 3}, 3, 1, true},  // held when it was lowered
		{resized{limit: 4, upto: 2}, 3, 1, false}, // waited
		{resized{limit: 6, upto: -1}, 3, 2, true},
	} {
		if st := permitStanding(ahead, c.seq, &c.r, 7, c.weight); st.mismatch != nil || st.held != c.held {
			t.Errorf("%d of 7, node %d behind 3 and 1, resized %+v: held %v (%v), want %v", c.weight, c.seq, c.r, st.held, st.mismatch, c.held)
		}
	}
	if st := permitStanding(nil, 0, &resized{limit: 2, upto: -1}, 3, 3); st.mismatch == nil {
		t.Errorf("3 permits of a semaphore resized to 2: no ErrLimitMismatch")
	}
}
