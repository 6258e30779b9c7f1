package filelock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestTurns: one goroutine at a time has a path's turn; a waiter whose
// context ends leaves without it, and passes on a wake-up it was sent; the
// table forgets a path when nobody wants it.
func TestTurns(t *testing.T) {
	var tt turnTable
	ctx := context.Background()
	done, err := tt.take(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// Another path is not held up.
	doneB, err := tt.take(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	doneB()

	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := tt.take(cctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take of a held turn with a context that ends: %v, want DeadlineExceeded", err)
	}

	got := make(chan func(), 1)
	go func() {
		d, err := tt.take(ctx, "a")
		if err != nil {
			t.Error(err)
			d = func() {}
		}
		got <- d
	}()
	select {
	case <-got:
		t.Fatal("a second goroutine had the turn while the first held it")
	case <-time.After(20 * time.Millisecond):
	}
	done()
	select {
	case d := <-got:
		d()
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken when the turn was free")
	}

	// Mutual exclusion under contention, with waiters that give up.
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		in, most int
	)
	for i := range 16 {
		wg.Go(func() {
			for j := range 100 {
				c, cancel := context.WithTimeout(ctx, time.Duration((i+j)%3)*time.Millisecond)
				d, err := tt.take(c, "c")
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				in++
				most = max(most, in)
				mu.Unlock()
				time.Sleep(10 * time.Microsecond)
				mu.Lock()
				in--
				mu.Unlock()
				d()
			}
		})
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d goroutines had the turn at once", most)
	}
	// Every turn was ended: the table is empty, and the path free.
	tt.mu.Lock()
	n := len(tt.m)
	tt.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d paths left in the table", n)
	}
	d, err := tt.take(cctx, "c") // cctx has ended: only a free turn is taken
	if err != nil {
		t.Fatalf("the turn is not free: %v", err)
	}
	d()
}
