package faults

import (
	"flag"
	"testing"
)

var runKnown = flag.Bool("faults.known", false, "also run the cases listed in knownBugs")

// knownBugs are cases that fail today, for reasons stated, and stay in
// the suite so that the fix is proven by them: `go test ./faults
// -faults.known` runs them. Each is an open part of issue #11.
var knownBugs = map[string]string{
	// Seen in 2 of about 8 runs, before and after the zklock session work:
	// no overlap, but the waiter never gets the lock after the server
	// resumes from a pause longer than the session timeout.
	"zk/server-paused": "liveness: a waiter may stay blocked after the server resumes from a pause past the session timeout (intermittent)",
}

// skipKnown skips a case listed in knownBugs unless -faults.known.
func skipKnown(t *testing.T, spec, name string) {
	if why, ok := knownBugs[spec+"/"+name]; ok && !*runKnown {
		t.Skipf("known open bug (issue #11), run with -faults.known: %s", why)
	}
}
