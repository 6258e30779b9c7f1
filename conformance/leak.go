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

// leakCheck returns a func that fails t if more goroutines than at the
// call are running from some creation site (the function that started
// them) when it is called, after waiting for them a while. Counting by
// site rather than by ID lets a client library replace its goroutines (a
// connection dialled again, a watch stream rebuilt after the cluster's
// leader changed) while a goroutine left behind still adds one at its
// site.
func leakCheck(t *testing.T, ignore []string) func() {
	before := settled()
	had := bySite(before, ignore)
	return func() {
		t.Helper()
		var left []string
		for deadline := time.Now().Add(10 * time.Second); ; {
			left = left[:0]
			now := goroutines()
			for site, n := range bySite(now, ignore) {
				if n <= had[site] {
					continue
				}
				for id, stack := range now {
					if _, old := before[id]; !old && creator(stack) == site {
						left = append(left, stack)
					}
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

// bySite counts the goroutines not ignored by their creation site.
func bySite(gs map[int64]string, ignore []string) map[string]int {
	out := map[string]int{}
	for _, stack := range gs {
		if !ignored(stack, ignore) {
			out[creator(stack)]++
		}
	}
	return out
}

// creator is the function that started the goroutine of stack ("" for
// the main goroutine).
func creator(stack string) string {
	_, after, ok := strings.Cut(stack, "\ncreated by ")
	if !ok {
		return ""
	}
	site, _, _ := strings.Cut(after, " in goroutine ")
	site, _, _ = strings.Cut(site, "\n")
	return site
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
