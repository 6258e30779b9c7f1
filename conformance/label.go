package conformance

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// sharedLabel: a label only describes a holder. Holders that share one
// (every Client of a process does by default: "host:pid") exclude each
// other as any two holders do, goroutines of one Client and two Clients
// alike, and the store records the label as the holder.
func (s *suite) sharedLabel(t *testing.T) {
	ctx := s.ctx(t)
	const label = "shared-label"
	c1, _ := s.clientDriver(t, locker.WithLabel(label))
	c2, _ := s.clientDriver(t, locker.WithLabel(label))
	name := s.name(t, "x")

	l := mustAcquire(t, ctx, c1, name)
	if l.Label() != label {
		t.Errorf("Label() = %q, want the Client's %q", l.Label(), label)
	}
	mustRefuse(t, ctx, c1, name, "another acquisition of the same Client shares the label, not the hold")
	mustRefuse(t, ctx, c2, name, "another Client shares the label, not the hold")
	mustRefuse(t, ctx, c2, name, "a per-call label equal to the holder's is no claim to its hold", locker.Label(label))
	if in, err := c2.Inspect(ctx, name); err == nil && in.Known.Has(locker.KnowsOwner) && in.Owner != label {
		t.Errorf("Inspect: Owner = %q, want the label %q", in.Owner, label)
	}
	mustRelease(t, ctx, l)

	// Goroutines that all give one per-call label, as a user who labels
	// with the host name does: never two inside.
	const workers, rounds = 4, 3
	var inside, most, done atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := []*locker.Client{c1, c2}[w%2]
			for range rounds {
				err := c.Do(ctx, name, func(context.Context) error {
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(5 * time.Millisecond)
					inside.Add(-1)
					done.Add(1)
					return nil
				}, locker.Label("host-a"))
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m != 1 {
		t.Errorf("%d holders with one label were inside at once, want 1", m)
	}
	if got := done.Load(); got != workers*rounds {
		t.Errorf("%d of %d Do calls ran", got, workers*rounds)
	}
}
