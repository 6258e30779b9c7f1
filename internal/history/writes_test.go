package history_test

import (
	"strings"
	"testing"

	"github.com/lockerhq/locker/internal/history"
)

func TestCheckWrites(t *testing.T) {
	type w = history.Write
	for _, ok := range [][]w{
		nil,
		{{"a", 1}},
		{{"a", 1}, {"a", 1}, {"b", 2}, {"b", 2}, {"c", 9}},
	} {
		if err := history.CheckWrites(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, c := range []struct {
		writes []w
		want   []string // one per violation
	}{
		{[]w{{"a", 3}, {"b", 4}, {"a", 3}}, []string{"write 3 (a, fence 3) landed after write 2 (b, fence 4)"}},
		// Judged against the highest fence so far, not the one before.
		{[]w{{"a", 1}, {"c", 7}, {"b", 2}, {"b", 2}, {"c", 7}}, []string{
			"write 3 (b, fence 2) landed after write 2 (c, fence 7)",
			"write 4 (b, fence 2) landed after write 2 (c, fence 7)",
		}},
	} {
		err := history.CheckWrites(c.writes)
		if err == nil {
			t.Errorf("%v: accepted", c.writes)
			continue
		}
		if got := strings.Split(err.Error(), "\n"); strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("%v:\n got %q\nwant %q", c.writes, got, c.want)
		}
	}
}
