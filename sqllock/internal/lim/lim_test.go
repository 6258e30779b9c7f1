package lim

import (
	"errors"
	"testing"

	"github.com/lockerhq/locker/backend"
)

func TestPacking(t *testing.T) {
	for _, c := range []struct{ limit, weight, lim int }{{1, 0, 1}, {5, 1, 5}, {5, 3, 5 + 2*Step}, {backend.MaxLimit, backend.MaxLimit, backend.MaxLimit + (backend.MaxLimit-1)*Step}} {
		got, err := Of("", backend.Claim{Limit: c.limit, Weight: c.weight})
		if err != nil || got != c.lim {
			t.Fatalf("Of(%d of %d) = %d, %v, want %d", c.weight, c.limit, got, err, c.lim)
		}
		if l, w := Split(got); l != c.limit || w != max(c.weight, 1) {
			t.Fatalf("Split(%d) = %d, %d, want %d, %d", got, l, w, c.limit, max(c.weight, 1))
		}
	}
	if got := backend.MaxLimit * Step; got > 1<<31-1 {
		t.Fatalf("lims up to %d overflow an int4", got)
	}
	for _, c := range []backend.Claim{{Limit: 0}, {Limit: 3, Weight: 4}, {Limit: backend.MaxLimit + 1}} {
		if _, err := Of("", c); !errors.Is(err, backend.ErrInvalidLimit) {
			t.Fatalf("Of(%d of %d) = %v, want ErrInvalidLimit", c.Weight, c.Limit, err)
		}
	}
}
