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
