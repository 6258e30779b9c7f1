package faults

import (
	"flag"
	"testing"
)

var runKnown = flag.Bool("faults.known", false, "also run the cases listed in knownBugs")

// knownBugs are cases that fail today, for reasons stated, and stay in
// the suite so that the fix is proven by them: `go test ./internal/faults
// -faults.known` runs them.
var knownBugs = map[string]string{
	// None today: every case passes on every backend.
}

// skipKnown skips a case listed in knownBugs unless -faults.known.
func skipKnown(t *testing.T, spec, name string) {
	if why, ok := knownBugs[spec+"/"+name]; ok && !*runKnown {
		t.Skipf("known open bug, run with -faults.known: %s", why)
	}
}
