package locker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// lateRefresh holds every refresh asking for the lock's whole TTL (the
// watchdog's) until the test lets it through; shorter ones (MinHold's
// linger) pass at once.
type lateRefresh struct {
	backend.Driver
	ttl  time.Duration
	in   atomic.Int32
	gate chan struct{}
}

func (d *lateRefresh) Refresh(ctx context.Context, c backend.Claim) error {
	if c.TTL == d.ttl {
		d.in.Add(1)
		<-d.gate
	}
	return d.Driver.Refresh(ctx, c)
}

// A watchdog refresh still in flight when a MinHold release lingers must not
// land after the linger: the lock would stay for a whole TTL instead of
// the minimum.
func TestMinHoldOutlastsARefreshInFlight(t *testing.T) {
	const ttl, minHold = 1200 * time.Millisecond, 700 * time.Millisecond
	s := memlock.NewStore()
	d := &lateRefresh{Driver: memDriver(s), ttl: ttl, gate: make(chan struct{})}
	c := newClientOn(t, d)
	other := newClient(t, s)
	ctx := context.Background()
	sent := time.Now() // the grant, and the minimum hold, come after
	l, err := c.TryAcquire(ctx, "job", locker.TTL(ttl), locker.MinHold(minHold))
	if err != nil {
		t.Fatal(err)
	}
	got := time.Now()
	for i := 0; d.in.Load() == 0; i++ {
		if i > 300 {
			close(d.gate)
			t.Fatal("the watchdog sent no refresh within 3s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	time.Sleep(50 * time.Millisecond)
	close(d.gate)
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Release did not return")
	}
	// Still held: a grant answered before the minimum hold (from a time
	// before the acquisition) fails; one answered later, on a machine that
	// ran this late, is the lock rightly free.
	if l2, err := other.TryAcquire(ctx, "job"); err == nil {
		if answered := time.Now(); answered.Before(sent.Add(minHold)) {
			t.Fatalf("taken %v after the acquisition was sent, before the minimum hold of %v", answered.Sub(sent), minHold)
		}
		t.Logf("the release came %v after the acquisition was sent, past the minimum hold: nothing to check before it", time.Since(sent))
		l2.Release(ctx)
	}
	time.Sleep(time.Until(got.Add(minHold + 150*time.Millisecond)))
	l2, err := other.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("%v after the grant, %v past the minimum hold, the lock is still held (the late refresh kept it for its TTL): %v",
			time.Since(got).Round(time.Millisecond), time.Since(got.Add(minHold)).Round(time.Millisecond), err)
	}
	l2.Release(ctx)
}
