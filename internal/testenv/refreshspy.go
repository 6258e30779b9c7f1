package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// RefreshSpy wraps a driver and records when each Refresh was sent and
// answered, for tests that bound how soon a holder learns of a theft. It
// hides the driver's optional interfaces (RefreshMany among them), so the
// Client refreshes each lock on its own.
type RefreshSpy struct {
	backend.Driver
	mu        sync.Mutex
	refreshes [][2]time.Time
}

func (s *RefreshSpy) Refresh(ctx context.Context, l backend.Claim) error {
	start := time.Now()
	err := s.Driver.Refresh(ctx, l)
	s.mu.Lock()
	s.refreshes = append(s.refreshes, [2]time.Time{start, time.Now()})
	s.mu.Unlock()
	return err
}

// WaitRefreshed returns as soon as a refresh sent after since is answered,
// and fails t if none is within a second.
func (s *RefreshSpy) WaitRefreshed(t testing.TB, since time.Time) {
	t.Helper()
	for range 1000 {
		s.mu.Lock()
		n := len(s.refreshes)
		done := n > 0 && s.refreshes[n-1][0].After(since)
		s.mu.Unlock()
		if done {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no refresh answered within a second")
}

// TakeFirstAfter returns when the first refresh sent after at was sent and
// answered (zero times if none was), and forgets every refresh recorded.
func (s *RefreshSpy) TakeFirstAfter(at time.Time) (sent, answered time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.refreshes {
		if r[0].After(at) {
			sent, answered = r[0], r[1]
			break
		}
	}
	s.refreshes = nil
	return sent, answered
}

// ExpectLost waits for lost after a theft at time at of a lock refreshed
// every TTL/3, and checks the bound a holder promises: Lost within TTL/3
// and a round trip (100 ms) of the theft, and within a round trip of the
// answer to the first refresh sent after it (if one was: else the refresh
// in flight at the theft found it). It forgets the recorded refreshes and
// returns how long Lost took.
func (s *RefreshSpy) ExpectLost(t testing.TB, what string, lost <-chan struct{}, at time.Time, ttl time.Duration) time.Duration {
	t.Helper()
	select {
	case <-lost:
	case <-time.After(ttl):
		t.Fatalf("%s: Lost did not fire within the TTL of the theft", what)
	}
	lostAt := time.Now()
	took := lostAt.Sub(at)
	if took > ttl/3+100*time.Millisecond {
		t.Errorf("%s: Lost fired %v after the theft, more than TTL/3 (%v) and a round trip", what, took, ttl/3)
	}
	sent, answered := s.TakeFirstAfter(at)
	if !sent.IsZero() && lostAt.Sub(answered) > 100*time.Millisecond {
		t.Errorf("%s: Lost fired %v after the first refresh since the theft was answered", what, lostAt.Sub(answered))
	}
	t.Logf("%s: lost %v after the theft (first refresh since: sent %v after it, answered in %v)", what,
		took.Round(time.Millisecond), sent.Sub(at).Round(time.Millisecond), answered.Sub(sent).Round(time.Millisecond))
	return took
}
