package sqldb

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// queued waits until g has n waiters.
func queued(t *testing.T, g *writeGate, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		g.mu.Lock()
		k := len(g.queue[0]) + len(g.queue[1])
		g.mu.Unlock()
		if k == n {
			return
		}
	}
	t.Fatalf("never %d waiters at the gate", n)
}

// Grants wait behind every write that keeps or ends a hold, whatever
// their arrival; within a class, arrival order.
func TestWriteGateUrgentFirst(t *testing.T) {
	var g writeGate
	ctx := context.Background()
	if err := g.lock(ctx, true); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, w := range []struct {
		name  string
		grant bool
	}{{"grant1", true}, {"grant2", true}, {"refresh1", false}, {"release2", false}} {
		wg.Go(func() {
			if err := g.lock(ctx, w.grant); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, w.name)
			mu.Unlock()
			g.unlock()
		})
		queued(t, &g, i+1)
	}
	g.unlock()
	wg.Wait()
	if want := []string{"refresh1", "release2", "grant1", "grant2"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}

// A waiter whose ctx ends leaves the queue: it does not take the gate,
// and the next waiter gets it.
func TestWriteGateCancelledWaiterLeaves(t *testing.T) {
	var g writeGate
	if err := g.lock(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	gone := errors.New("gone")
	done := make(chan error, 1)
	go func() { done <- g.lock(ctx, false) }()
	queued(t, &g, 1)
	next := make(chan error, 1)
	go func() { next <- g.lock(context.Background(), true) }()
	queued(t, &g, 2)
	cancel(gone)
	if err := <-done; !errors.Is(err, gone) {
		t.Fatalf("cancelled waiter: %v, want its ctx's cause", err)
	}
	queued(t, &g, 1)
	g.unlock()
	select {
	case err := <-next:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next waiter never got the gate")
	}
	g.unlock()
	if g.held {
		t.Fatal("the gate is held with nobody in it")
	}
}
