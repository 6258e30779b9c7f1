package history_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/history"
)

// at builds histories on a fixed timeline: ms after the recorder's start.
func at(r *history.Recorder, ms int) time.Time {
	return r.Start().Add(time.Duration(ms) * time.Millisecond)
}

// hold records a holder of name that acquired at acq (ms) with fence and
// ended by release start at rel (ms; -1: never) or lost at lost (ms; -1: never).
func hold(r *history.Recorder, name string, acq int, fence uint64, rel, lost int) *history.Holder {
	h := r.BeginAt(at(r, acq-1), name, "c", time.Second)
	h.AcquiredAt(at(r, acq), fence)
	if lost >= 0 {
		h.LostAt(at(r, lost))
	}
	if rel >= 0 {
		h.ReleaseStartAt(at(r, rel))
		h.ReleasedAt(at(r, rel+1), nil)
	}
	return h
}

func TestAcceptsCorrectHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(r *history.Recorder)
	}{
		{"sequential releases", func(r *history.Recorder) {
			hold(r, "a", 10, 1, 20, -1)
			hold(r, "a", 21, 2, 30, -1)
			hold(r, "a", 31, 3, -1, -1) // still holding at the end
		}},
		{"lost before the next grant", func(r *history.Recorder) {
			hold(r, "a", 10, 5, 2000, 1000) // told at 1000, released late
			hold(r, "a", 1001, 6, 1500, -1)
		}},
		{"names are independent", func(r *history.Recorder) {
			hold(r, "a", 10, 1, -1, -1)
			hold(r, "b", 11, 1, -1, -1)
		}},
		{"failed attempts and zero fences are ignored", func(r *history.Recorder) {
			hold(r, "a", 10, 0, 20, -1)
			h := r.BeginAt(at(r, 12), "a", "c", time.Second)
			h.Failed(nil)
			hold(r, "a", 25, 0, 30, -1)
		}},
		{"lost exactly when the next is granted", func(r *history.Recorder) {
			hold(r, "a", 10, 1, -1, 100)
			hold(r, "a", 100, 2, -1, -1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := history.New()
			tc.build(r)
			if res := r.Check(history.Options{}); !res.OK() {
				t.Fatalf("a correct history rejected:\n%s", res.Report())
			}
		})
	}
}

func TestCatchesBrokenHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(r *history.Recorder)
		kind  history.Kind
		want  string // in the report
	}{
		{"overlap, first never told", func(r *history.Recorder) {
			r.BeginAt(at(r, 900), "b", "c", time.Second) // the history ends at +900ms
			hold(r, "a", 10, 1, -1, -1)
			hold(r, "a", 500, 2, 600, -1)
		}, history.Overlap, `overlap on "a" for 400ms`},
		{"overlap, first told too late", func(r *history.Recorder) {
			hold(r, "a", 10, 1, -1, 5000) // lost only at 5 s
			hold(r, "a", 800, 2, -1, -1)
		}, history.Overlap, "for 4.2s"},
		{"overlap, release began after the next grant", func(r *history.Recorder) {
			hold(r, "a", 10, 1, 300, -1)
			hold(r, "a", 290, 2, -1, -1)
		}, history.Overlap, "release began +300ms"},
		{"fence goes back", func(r *history.Recorder) {
			hold(r, "a", 10, 7, 20, -1)
			hold(r, "a", 30, 7, 40, -1)
		}, history.FenceOrder, "fence 7 <= 7"},
		{"fence goes back past a zero", func(r *history.Recorder) {
			hold(r, "a", 10, 9, 20, -1)
			hold(r, "a", 30, 0, 40, -1)
			hold(r, "a", 50, 3, 60, -1)
		}, history.FenceOrder, "fence 3 <= 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := history.New()
			tc.build(r)
			res := r.Check(history.Options{})
			if res.OK() {
				t.Fatal("a broken history accepted")
			}
			if res.Violations[0].Kind != tc.kind {
				t.Fatalf("kind %v, want %v:\n%s", res.Violations[0].Kind, tc.kind, res.Report())
			}
			if rep := res.Report(); !strings.Contains(rep, tc.want) {
				t.Fatalf("report lacks %q:\n%s", tc.want, rep)
			}
			t.Logf("report:\n%s", res.Report())
		})
	}
}

func TestAllowance(t *testing.T) {
	r := history.New()
	hold(r, "a", 10, 1, -1, 1005) // told 5 ms after the next grant
	hold(r, "a", 1000, 2, -1, -1)
	if res := r.Check(history.Options{}); res.OK() {
		t.Fatal("a 5 ms overlap accepted with no allowance")
	}
	allow := func(history.Snapshot) time.Duration { return 12 * time.Millisecond }
	if res := r.Check(history.Options{Allow: allow}); !res.OK() {
		t.Fatalf("a 5 ms overlap rejected with a 12 ms allowance:\n%s", res.Report())
	}
	few := func(history.Snapshot) time.Duration { return 4 * time.Millisecond }
	if res := r.Check(history.Options{Allow: few}); res.OK() {
		t.Fatal("a 5 ms overlap accepted with a 4 ms allowance")
	}
}

func TestEveryLaterHolderOfAnOpenHoldIsReported(t *testing.T) {
	r := history.New()
	hold(r, "a", 10, 1, -1, -1)
	hold(r, "a", 20, 2, 30, -1)
	hold(r, "a", 40, 3, 50, -1)
	res := r.Check(history.Options{})
	if len(res.Violations) != 2 || res.Acquired != 3 || res.Names != 1 {
		t.Fatalf("got %d violations, %d acquired, %d names:\n%s", len(res.Violations), res.Acquired, res.Names, res.Report())
	}
}

func TestConcurrentRecording(t *testing.T) {
	r := history.New()
	var mu sync.Mutex // the lock under test: a correct one
	var fence uint64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				h := r.Begin("n", "g", time.Second)
				mu.Lock()
				fence++
				h.Acquired(fence)
				h.ReleaseStart()
				mu.Unlock()
				h.Released(nil)
			}
		}()
	}
	wg.Wait()
	res := r.Check(history.Options{})
	if !res.OK() || res.Acquired != 1600 {
		t.Fatalf("%d acquired:\n%s", res.Acquired, res.Report())
	}
}
