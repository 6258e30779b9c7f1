package fencetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// Overrunning runs holders that overrun their TTL at random (they sleep
// past it), writing as they go: every write is accepted or refused with
// ErrStale, the resource holds exactly the accepted ones, some of each,
// and history.CheckWrites finds them in fence order.
func Overrunning(t *testing.T, o Open) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := open(ctx, t, o, "o"+testutil.RandHex(4), t.TempDir())
	store := memlock.NewStore()
	const workers, rounds = 4, 8
	var stale int
	accepted := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		d, err := memlock.New(store)
		c := client(t, d, err)
		wg.Go(func() {
			for r := range rounds {
				l, err := c.Acquire(ctx, resource, locker.TTL(100*time.Millisecond), locker.AutoRefresh(false))
				if err != nil {
					t.Error(err)
					return
				}
				for i := range 3 {
					if (w+r+i)%4 == 0 {
						time.Sleep(150 * time.Millisecond) // past the TTL: paused
					}
					who := fmt.Sprintf("w%d.%d.%d", w, r, i)
					err := s.Write(ctx, who, l.Fence(), false)
					mu.Lock()
					switch {
					case err == nil:
						accepted[who] = true
					case errors.Is(err, fenced.ErrStale):
						stale++
					default:
						t.Error(err)
					}
					mu.Unlock()
				}
				l.Release(ctx)
			}
		})
	}
	wg.Wait()
	writes, err := s.Writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := history.CheckWrites(writes); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, w := range writes {
		if accepted[w.Who] {
			held++
		}
	}
	if held != len(accepted) || len(writes) != len(accepted) || len(accepted) == 0 || stale == 0 {
		t.Fatalf("the resource holds %d writes, %d of the %d accepted; %d were refused: want the accepted ones only, and some of each", len(writes), held, len(accepted), stale)
	}
}
