package backend

import "testing"

func TestPermitTag(t *testing.T) {
	for _, c := range []struct{ limit, weight int }{{1, 1}, {5, 1}, {5, 3}, {MaxLimit, MaxLimit}} {
		l, w, ok := ParsePermitTag(PermitTag(c.limit, c.weight))
		if !ok || l != c.limit || w != c.weight {
			t.Errorf("ParsePermitTag(PermitTag(%d, %d)) = %d, %d, %v", c.limit, c.weight, l, w, ok)
		}
	}
	if PermitTag(5, 1) != "5" {
		t.Errorf("PermitTag(5, 1) = %q, want the bare limit that older versions write", PermitTag(5, 1))
	}
	for _, s := range []string{"", "x", "5x", "x3", "5x0", "0", "-1", "5x3x2", "owner"} {
		if l, w, ok := ParsePermitTag(s); ok {
			t.Errorf("ParsePermitTag(%q) = %d, %d, true, want false", s, l, w)
		}
	}
}
