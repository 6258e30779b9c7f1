package etcdlock

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestCancelledWaitsLeaveNoStream: waits cancelled at every moment of
// their first milliseconds, some before etcd confirmed the waiter's watch,
// leave no watch stream behind: the stream that serves them is the one the
// driver opened with the client. (The etcd client keeps a stream whose only
// watch was cancelled before it was confirmed until its next watch ends.)
// Not parallel: it counts every stream goroutine of the process, and the
// drivers that parallel tests open meanwhile start streams of their own.
func TestCancelledWaitsLeaveNoStream(t *testing.T) {
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 60*time.Second)
	c1, _ := h.client(t)
	c2, _ := h.client(t)
	l, err := c1.TryAcquire(ctx, "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	keepersUp(t)
	before := streamGoroutines()
	for i := range 40 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(i)*100*time.Microsecond)
		_, err := c2.Acquire(wctx, "stream")
		cancel()
		if !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("Acquire of a held lock past its deadline = %v", err)
		}
	}
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for id, stack := range streamGoroutines() {
			if _, ok := before[id]; !ok {
				left = append(left, stack)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Fatalf("%d watch stream goroutine(s) left by cancelled waits:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// keepersUp waits until every driver's keeper (keepStream) holds its
// confirmed watch, its goroutine receiving from the watch's channel: the
// client's Watch returns once etcd confirmed it, so the goroutines of the
// keepers' streams all run by then. Sampled earlier, a stream still
// connecting would start them during the waits.
func keepersUp(t *testing.T) {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		up := true
		for _, g := range strings.Split(string(buf), "\n\n") {
			up = up && (!strings.Contains(g, "(*Driver).keepStream") || strings.Contains(g, "[chan receive"))
		}
		if up {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the drivers' stream keepers hold no confirmed watch 10s later")
		}
	}
}

// streamGoroutines returns the stacks of the etcd client's watch stream
// goroutines, by their header line (which holds the goroutine's ID).
func streamGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "watchGRPCStream") {
			id, _, _ := strings.Cut(g, " [")
			out[id] = g
		}
	}
	return out
}
