package backend

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestGateCloseEndsAndAwaitsCalls(t *testing.T) {
	var g Gate
	ctx, done, err := g.Enter(context.Background())
	if err != nil {
		t.Fatalf("Enter on an open gate: %v", err)
	}
	var returned atomic.Bool
	go func() {
		<-ctx.Done() // a call that returns only when its context ends
		time.Sleep(20 * time.Millisecond)
		// Set before done: a Close that waits for done sees it (closing
		// a channel after done raced with Close's return).
		returned.Store(true)
		done()
	}()
	closed := make(chan bool)
	go func() { closed <- g.Close() }()
	select {
	case first := <-closed:
		if !returned.Load() {
			t.Fatal("Close returned before the call in flight")
		}
		if !first {
			t.Fatal("the first Close reported that the gate was closed already")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the call's context")
	}
	if g.Close() {
		t.Fatal("a second Close reported closing the gate")
	}
	if _, _, err := g.Enter(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enter after Close = %v, want ErrClosed", err)
	}
	if !g.Closed() || g.Context().Err() == nil {
		t.Fatal("Closed or Context do not show the closed gate")
	}
}

func TestGateCallContextKeepsCallersEnd(t *testing.T) {
	var g Gate
	parent, cancel := context.WithCancel(context.Background())
	ctx, done, err := g.Enter(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	cancel()
	if ctx.Err() == nil {
		t.Fatal("the caller's cancel did not reach the call's context")
	}
	if g.Context().Err() != nil {
		t.Fatal("a caller's cancel closed the gate")
	}
}

func TestGateTrackCancelsAtClose(t *testing.T) {
	var g Gate
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	done, err := g.Track(cancel)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-ctx.Done()
		done()
	}()
	g.Close()
	if ctx.Err() == nil {
		t.Fatal("Close did not cancel the tracked call's context")
	}
	if _, err := g.Track(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Track after Close = %v, want ErrClosed", err)
	}
}

// A call on a context that never ends shares the gate's: one allocation,
// with the caller's values, and what derives from it ends at Close.
func TestGateEndlessCall(t *testing.T) {
	var g Gate
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	if n := testing.AllocsPerRun(100, func() {
		_, done, err := g.Enter(parent)
		if err != nil {
			t.Fatal(err)
		}
		done()
	}); n > 1 {
		t.Fatalf("Enter+done on a context that never ends: %v allocations, want at most 1", n)
	}
	ctx, done, err := g.Enter(parent)
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Value(key{}) != "v" {
		t.Fatal("the call's context lost the caller's value")
	}
	child, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	go func() {
		<-child.Done()
		done()
	}()
	g.Close()
	if ctx.Err() == nil || child.Err() == nil || !errors.Is(context.Cause(child), context.Canceled) {
		t.Fatal("Close did not end the call's context and what derives from it")
	}
}

// A call entered from another gate's endless call (a Client's into its
// driver) gets no context of its own, yet ends with either gate's Close.
func TestGateNestedEndlessCall(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	for _, closeOuter := range []bool{true, false} {
		var outer, inner Gate
		octx, odone, err := outer.Enter(parent)
		if err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() {
			_, done, err := inner.Enter(octx)
			if err != nil {
				t.Fatal(err)
			}
			done()
		}); n > 1 {
			t.Fatalf("Enter+done from another gate's endless call: %v allocations, want at most 1", n)
		}
		if n := testing.AllocsPerRun(100, func() {
			octx, odone, _ := outer.Enter(context.Background())
			_, done, err := inner.Enter(octx)
			if err != nil {
				t.Fatal(err)
			}
			done()
			odone()
		}); n > 0 {
			t.Fatalf("Enter+done on context.Background(), then from it into another gate: %v allocations, want none", n)
		}
		ctx, done, err := inner.Enter(octx)
		if err != nil {
			t.Fatal(err)
		}
		if ctx.Value(key{}) != "v" {
			t.Fatal("the call's context lost the caller's value")
		}
		go func() {
			<-ctx.Done()
			done()
		}()
		closing := &inner
		if closeOuter {
			closing = &outer
			go func() {
				<-octx.Done()
				odone()
			}()
		} else {
			defer odone()
		}
		closed := make(chan bool)
		go func() { closed <- closing.Close() }()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("closing the outer gate (%v) or the inner did not end the call", closeOuter)
		}
		<-closed
		if closeOuter {
			// The joint is forgotten once the outer gate has closed.
			deadline := time.Now().Add(5 * time.Second)
			for {
				inner.mu.Lock()
				n := len(inner.joints)
				inner.mu.Unlock()
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the inner gate kept the joint of a closed gate")
				}
				time.Sleep(time.Millisecond)
			}
		} else if octx.Err() != nil {
			t.Fatal("closing the inner gate ended the outer gate's call")
		}
		inner.Close()
	}
}

// detached is a hand-written context.WithoutCancel, as code older than it
// has: it never ends, and passes every Value through, its parent's
// cancellation included.
type detached struct{ context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }

// A call on such a context ends at Close, and says so, though its parent
// (ended, with a cause of its own) is what its Value would find.
func TestGateEndlessCallDetached(t *testing.T) {
	var g Gate
	parent, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	ctx, done, err := g.Enter(detached{parent})
	if err != nil {
		t.Fatal(err)
	}
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-child.Done()
		done()
	}()
	stop(errors.New("the caller's own cause"))
	g.Close()
	if !errors.Is(context.Cause(ctx), context.Canceled) || !errors.Is(context.Cause(child), context.Canceled) {
		t.Fatalf("after Close: Cause = %v, %v; want context.Canceled for both", context.Cause(ctx), context.Cause(child))
	}
}

func TestGateFailed(t *testing.T) {
	var g Gate
	cause := errors.New("cause")
	ctx, cancel := context.WithCancelCause(context.Background())
	if err := g.Failed(ctx, cause); err != cause {
		t.Fatalf("Failed with ctx alive = %v, want the error itself", err)
	}
	cancel(errors.New("caller gave up"))
	if err := g.Failed(ctx, cause); err == nil || err.Error() != "caller gave up" {
		t.Fatalf("Failed with ctx ended = %v, want ctx's cause", err)
	}
	g.Close()
	if err := g.Failed(ctx, cause); !errors.Is(err, ErrClosed) {
		t.Fatalf("Failed once closed = %v, want ErrClosed", err)
	}
}

// BenchmarkGateNested is a Client's call on context.Background() entered
// into its driver's gate, from 16 goroutines on 2 cores.
func BenchmarkGateNested(b *testing.B) {
	var outer, inner Gate
	defer outer.Close()
	defer inner.Close()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			octx, odone, _ := outer.Enter(context.Background())
			ctx, done, _ := inner.Enter(octx)
			_ = ctx.Done()
			done()
			odone()
		}
	})
}
