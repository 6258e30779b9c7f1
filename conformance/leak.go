package conformance

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// goroutines returns the stack of every goroutine, by ID.
func goroutines() map[int64]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[int64]string{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		head, _, _ := strings.Cut(string(g), " [")
		id, err := strconv.ParseInt(strings.TrimPrefix(head, "goroutine "), 10, 64)
		if err == nil {
			out[id] = string(g)
		}
	}
	return out
}

// leakCheck returns a func that fails t if goroutines started after the
// call are still running when it is called (after waiting for them a while).
func leakCheck(t *testing.T, ignore []string) func() {
	before := settled()
	return func() {
		t.Helper()
		var left []string
		for deadline := time.Now().Add(10 * time.Second); ; {
			left = left[:0]
			for id, stack := range goroutines() {
				if _, old := before[id]; !old && !ignored(stack, ignore) {
					left = append(left, stack)
				}
			}
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(left) > 0 {
			t.Errorf("%d goroutine(s) left running:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
	}
}

// settled returns goroutines() once no goroutine has started or ended for
// 100 ms (at most 2 s): a client made just before the check (the case's
// second client, whose connections to a cluster's other members come up
// in the background) starts goroutines of its own a moment later, and
// they are not the tested driver's.
func settled() map[int64]string {
	cur := goroutines()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		next := goroutines()
		if sameIDs(cur, next) {
			return next
		}
		cur = next
	}
	return cur
}

func sameIDs(a, b map[int64]string) bool {
	if len(a) != len(b) {
		return false
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			return false
		}
	}
	return true
}

func ignored(stack string, ignore []string) bool {
	for _, s := range ignore {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}
