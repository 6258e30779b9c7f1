package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// watchReports: once Watch returns, every release of the lock reaches the
// watcher (a one-shot store watch must be set again), and stop frees
// what the watch used.
func (s *suite) watchReports(t *testing.T) {
	ctx := s.ctx(t)
	c, watcher := s.client(t), s.client(t)
	name := s.name(t, "x")
	// Warm up, so lazily started per-client machinery is not counted.
	_, stop, err := watcher.Watch(ctx, name)
	if errors.Is(err, locker.ErrUnsupported) {
		t.Skip("the backend does not report releases (no backend.Notifier)")
	}
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	mustRelease(t, ctx, mustAcquire(t, ctx, c, name))
	stop()

	check := leakCheck(t, s.tr.IgnoreGoroutines)
	l := mustAcquire(t, ctx, c, name)
	ch, stop, err := watcher.Watch(ctx, name)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for i := range 3 {
		drain(ch)
		mustRelease(t, ctx, l)
		select {
		case <-ch:
		case <-time.After(s.slack()):
			t.Fatalf("release %d: no value on the Watch channel within %v", i+1, s.slack())
		}
		l = mustAcquire(t, ctx, c, name)
	}
	mustRelease(t, ctx, l)
	stop()
	stop() // idempotent
	check()

	// A Watch ends with its context too.
	check = leakCheck(t, s.tr.IgnoreGoroutines)
	wctx, cancel := context.WithCancel(ctx)
	if _, _, err := watcher.Watch(wctx, name); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cancel()
	check()
}

// drain empties ch of a value sent before now.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}
