package conformance

import (
	"context"
	"testing"
	"time"
)

// releaseAfterCancel: a Release whose context has ended, as in
// `defer l.Release(ctx)` in a handler whose request ended, still frees
// the lock, and says nothing of the context when the store confirmed the
// release: another client takes the name at once.
func (s *suite) releaseAfterCancel(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	ended := map[string]func() context.Context{
		"cancelled": func() context.Context {
			rctx, cancel := context.WithCancel(ctx)
			cancel()
			return rctx
		},
		"past its deadline": func() context.Context {
			rctx, cancel := context.WithDeadline(ctx, time.Now())
			t.Cleanup(cancel)
			return rctx
		},
	}
	for how, end := range ended {
		l := mustAcquire(t, ctx, c1, name)
		if err := l.Release(end()); err != nil {
			t.Fatalf("Release with a context %s = %v, want nil: the store could be reached", how, err)
		}
		l2, err := c2.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("TryAcquire right after a Release with a context %s: %v", how, err)
		}
		mustRelease(t, ctx, l2)
	}
}
