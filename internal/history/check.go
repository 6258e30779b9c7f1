package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind is what a violation breaks.
type Kind int

const (
	// Overlap: a holder acquired a name while an earlier holder of it still
	// believed it held it (neither released nor told of the loss).
	Overlap Kind = iota + 1
	// FenceOrder: a grant's fence is not greater than that of an earlier
	// grant of the same name.
	FenceOrder
)

func (k Kind) String() string {
	switch k {
	case Overlap:
		return "overlap"
	case FenceOrder:
		return "fence order"
	}
	return "unknown"
}

// Violation is one broken rule between two holders of one name: First was
// granted before Second.
type Violation struct {
	Kind          Kind
	Name          string
	First, Second Snapshot
	// By is, for an overlap, how long the two believed they held the name
	// together (to the end of First's belief, or of the history).
	By time.Duration

	start time.Time
}

// Options tune Check.
type Options struct {
	// Allow returns the overlap tolerated after first's end (its lost signal
	// or release start) before a later holder counts as overlapping: what the
	// test cannot measure more precisely than that (e.g. when the lost
	// signal is observed by a goroutine). Nil tolerates nothing.
	Allow func(first Snapshot) time.Duration
}

// Result is what Check found.
type Result struct {
	Holders    int // Begin calls
	Acquired   int // successful acquisitions checked
	Names      int // names with at least one acquisition
	Violations []Violation
}

// OK reports no violation.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// Report is a readable list of the violations, or "" when there are none.
func (r Result) Report() string {
	if r.OK() {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d violation(s) in %d acquisitions of %d names:\n", len(r.Violations), r.Acquired, r.Names)
	for _, v := range r.Violations {
		b.WriteString("  ")
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Check examines the history so far. For each name, holders are taken in
// the order Acquire returned. An overlap is a holder B acquiring while an
// earlier holder A still believes it holds the name: B.Acquired before
// A.End() minus the allowance, or A never ended. A fence violation is a
// non-zero fence not greater than the previous non-zero fence.
func (r *Recorder) Check(opts Options) Result {
	all := r.Holders()
	res := Result{Holders: len(all)}
	byName := map[string][]Snapshot{}
	for _, s := range all {
		if s.Held() {
			byName[s.Name] = append(byName[s.Name], s)
			res.Acquired++
		}
	}
	res.Names = len(byName)
	histEnd := time.Now()
	for _, s := range all {
		for _, t := range []time.Time{s.Begin, s.Acquired, s.Lost, s.ReleaseStart, s.Released} {
			if t.After(histEnd) {
				histEnd = t
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		hs := byName[n]
		sort.SliceStable(hs, func(i, j int) bool { return hs[i].Acquired.Before(hs[j].Acquired) })
		res.Violations = append(res.Violations, r.overlaps(hs, opts, histEnd)...)
		res.Violations = append(res.Violations, r.fences(hs)...)
	}
	return res
}

func (r *Recorder) overlaps(hs []Snapshot, opts Options, histEnd time.Time) []Violation {
	var out []Violation
	for i, a := range hs {
		end := a.End()
		var allow time.Duration
		if opts.Allow != nil {
			allow = opts.Allow(a)
		}
		for _, b := range hs[i+1:] {
			// b was granted after a. A violation if a still counted on the
			// lock then.
			if !end.IsZero() && !b.Acquired.Before(end.Add(-allow)) {
				break // later holders were granted later still
			}
			until := end
			if until.IsZero() {
				until = histEnd
			}
			by := until.Sub(b.Acquired)
			out = append(out, Violation{Kind: Overlap, Name: a.Name, First: a, Second: b, By: by, start: r.start})
		}
	}
	return out
}

func (r *Recorder) fences(hs []Snapshot) []Violation {
	var out []Violation
	var prev *Snapshot
	for i := range hs {
		s := hs[i]
		if s.Fence == 0 {
			continue
		}
		if prev != nil && s.Fence <= prev.Fence {
			out = append(out, Violation{Kind: FenceOrder, Name: s.Name, First: *prev, Second: s, start: r.start})
		}
		prev = &hs[i]
	}
	return out
}

// rel formats t relative to the recorder's start.
func rel(start, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return "+" + t.Sub(start).Round(100*time.Microsecond).String()
}

func describe(start time.Time, s Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d (%s, fence %d, ttl %v): began %s, acquired %s", s.ID, s.Client, s.Fence, s.TTL, rel(start, s.Begin), rel(start, s.Acquired))
	if !s.Lost.IsZero() {
		fmt.Fprintf(&b, ", lost %s", rel(start, s.Lost))
	}
	if !s.ReleaseStart.IsZero() {
		fmt.Fprintf(&b, ", release began %s", rel(start, s.ReleaseStart))
	}
	if s.End().IsZero() {
		b.WriteString(", still holding")
	}
	return b.String()
}

func (v Violation) String() string {
	switch v.Kind {
	case Overlap:
		return fmt.Sprintf("overlap on %q for %v: %s; yet %s", v.Name, v.By.Round(100*time.Microsecond),
			describe(v.start, v.First), describe(v.start, v.Second))
	case FenceOrder:
		return fmt.Sprintf("fence order on %q: %s; then %s with fence %d <= %d", v.Name,
			describe(v.start, v.First), describe(v.start, v.Second), v.Second.Fence, v.First.Fence)
	}
	return "unknown violation"
}
