package etcdlock

import (
	"context"
	"testing"
	"time"
)

// TestCutterCutsLateAttempts: an attempt still running is cut between
// attemptTimeout and attemptTimeout+cutTick after it began, one that ended
// is not, and the cutter stops ticking once none is left.
func TestCutterCutsLateAttempts(t *testing.T) {
	c := newCutter()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx) }()
	defer func() { stop(); <-done }()

	// Short attempts come and go meanwhile, filed at every tick in turn, as
	// the ticks go by (under -race: the cutter's sweep against them).
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for end := time.Now().Add(attemptTimeout + 2*cutTick); time.Now().Before(end); time.Sleep(time.Millisecond) {
			_, done := c.start(context.Background())
			done()
		}
	}()
	for round := range 2 { // the second after the cutter went idle
		began := time.Now()
		late, endLate := c.start(context.Background())
		quick, endQuick := c.start(context.Background())
		endQuick()
		select {
		case <-late.Done():
		case <-time.After(attemptTimeout + cutTick + 2*time.Second):
			t.Fatalf("round %d: attempt not cut after %v", round, time.Since(began))
		}
		took := time.Since(began)
		endLate()
		if took < attemptTimeout {
			t.Fatalf("round %d: attempt cut after %v, before attemptTimeout %v", round, took, attemptTimeout)
		}
		if took > attemptTimeout+cutTick+time.Second {
			t.Errorf("round %d: attempt cut after %v, want at most about %v", round, took, attemptTimeout+cutTick)
		}
		if quick.Err() != context.Canceled { // by its own end
			t.Fatalf("round %d: ended attempt: %v", round, quick.Err())
		}
		if round == 0 {
			<-churned
		}
		c.mu.Lock()
		n := len(c.live)
		c.mu.Unlock()
		if n != 0 {
			t.Fatalf("round %d: %d attempts still filed", round, n)
		}
		// Idle: the ticker stops within a tick; then a new attempt must wake it.
		time.Sleep(2 * cutTick)
	}
}
