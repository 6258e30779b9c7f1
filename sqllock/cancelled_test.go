package sqllock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// Acquisitions cancelled while they contend, then the Clients closed at
// once, leave the lock free. Before the server cancelled the statements,
// an acquisition the server committed after its connection was dropped
// kept the lock held for its TTL in most rounds (lockctl bench's scale
// workload then saw no acquisition at all).
func TestCancelledAcquisitionsLeaveNothing(t *testing.T) {
	h := newHarness(t)
	for round := range 4 {
		var clients []*locker.Client
		for range 8 {
			c, err := locker.Open(context.Background(), h.url)
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
		name := "cancelled-" + time.Now().Format("150405.000000")
		ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Go(func() {
				for n := 0; ctx.Err() == nil && n < 100000; n++ {
					l, err := c.Acquire(ctx, name)
					if err != nil {
						if !errors.Is(err, locker.ErrNotAcquired) {
							t.Errorf("Acquire: %v", err)
						}
						return
					}
					if err := l.Release(context.Background()); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
		wg.Wait()
		cancel()
		for _, c := range clients {
			c.Close()
		}
		c, err := locker.Open(context.Background(), h.url)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Inspect(context.Background(), name)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Held {
			t.Fatalf("round %d: held under fence %d for %v more, though every acquisition was released or cancelled", round, st.Fence, st.TTL)
		}
	}
}
