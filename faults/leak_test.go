package faults

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"time"
)

// labeledGoroutines returns the stacks of the goroutines that carry the
// client's pprof label: those its driver, client libraries and Client
// started (labels pass from a goroutine to those it starts), whatever
// other tests run in parallel.
func labeledGoroutines(id string) []string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	var out []string
	want := `"faultclient":"` + id + `"`
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(rec, "# labels:") && strings.Contains(rec, want) {
			out = append(out, rec)
		}
	}
	return out
}

// leftAfterClose waits up to d for the client's goroutines to end and
// returns those still running.
func (cl *client) leftAfterClose(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		left := labeledGoroutines(cl.id)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}
