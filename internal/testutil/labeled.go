package testutil

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"time"
)

// Labeled returns the stacks of the goroutines that carry the pprof label
// key=value: those started, directly or not, inside pprof.Do with it
// (labels pass from a goroutine to those it starts), whatever other tests
// run in parallel. A test runs what it checks for leaks inside pprof.Do
// with a label of its own.
func Labeled(key, value string) []string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := `"` + key + `":"` + value + `"`
	var out []string
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(rec, "# labels:") && strings.Contains(rec, want) {
			out = append(out, rec)
		}
	}
	return out
}

// LabeledAfter waits up to d for the goroutines labeled key=value to end,
// and returns those still running.
func LabeledAfter(key, value string, d time.Duration) []string {
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if left := Labeled(key, value); len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}
