package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// spyDriver records when each Refresh was sent and answered. It hides
// RefreshMany, which a lone hold does not use anyway.
type spyDriver struct {
	backend.Driver
	mu        sync.Mutex
	refreshes [][2]time.Time
}

// waitRefreshed returns as soon as a refresh sent after since is answered
// (within a second).
func (s *spyDriver) waitRefreshed(t *testing.T, since time.Time) {
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

func (s *spyDriver) Refresh(ctx context.Context, l backend.Lock) error {
	start := time.Now()
	err := s.Driver.Refresh(ctx, l)
	s.mu.Lock()
	s.refreshes = append(s.refreshes, [2]time.Time{start, time.Now()})
	s.mu.Unlock()
	return err
}

// memcached has no authentication: any client that reaches the port can
// delete or overwrite a held lock's item. The holder's Lost fires by the
// end of the first refresh sent after that, which the watchdog sends at
// most TTL/3 after the one before it: within TTL/3 and a round trip.
func TestTheftIsNoticed(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	d, err := Open(ctx, &url.URL{Scheme: "memcache", Host: addr})
	if err != nil {
		t.Fatal(err)
	}
	spy := &spyDriver{Driver: d}
	ns := "mctest-" + randHex(4)
	c, err := locker.New(spy, locker.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	thief := memcache.New(addr)
	defer thief.Close()
	const ttl = time.Second // memcached's TTLs are whole seconds
	var worst time.Duration
	// The last two steal right after a refresh was answered: the worst
	// case, a whole TTL/3 before the next.
	for i, theft := range []string{"delete", "set", "delete", "set", "delete", "set", "delete", "set"} {
		name := fmt.Sprintf("job-%d", i)
		l, err := c.Acquire(ctx, name, locker.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL() != ttl {
			t.Fatalf("effective TTL %v, want %v", l.TTL(), ttl)
		}
		if i < 6 {
			// Steal at a different phase of the refresh cycle each time.
			time.Sleep(ttl/2 + time.Duration(i)*ttl/9)
		} else {
			spy.waitRefreshed(t, time.Now())
		}
		key := lockKey(backend.Key(ns, name))
		at := time.Now()
		if theft == "delete" {
			err = thief.Delete(key)
		} else {
			err = thief.Set(&memcache.Item{Key: key, Value: []byte("thief"), Expiration: 60})
		}
		if err != nil {
			t.Fatalf("%s: %v", theft, err)
		}
		select {
		case <-l.Lost():
		case <-time.After(ttl):
			t.Fatalf("%s: Lost did not fire within the TTL of the theft", theft)
		}
		lostAt := time.Now()
		lost := lostAt.Sub(at)
		worst = max(worst, lost)
		if lost > ttl/3+100*time.Millisecond {
			t.Errorf("%s: Lost fired %v after the theft, more than TTL/3 (%v) and a round trip", theft, lost, ttl/3)
		}
		spy.mu.Lock()
		var first [2]time.Time
		for _, r := range spy.refreshes {
			if r[0].After(at) {
				first = r
				break
			}
		}
		spy.refreshes = nil
		spy.mu.Unlock()
		// None: the refresh in flight at the theft found it.
		if !first[0].IsZero() && lostAt.Sub(first[1]) > 100*time.Millisecond {
			t.Errorf("%s: Lost fired %v after the first refresh since the theft was answered", theft, lostAt.Sub(first[1]))
		}
		if !errors.Is(l.Err(), locker.ErrLost) {
			t.Errorf("%s: Err() = %v", theft, l.Err())
		}
		t.Logf("%s: lost %v after the theft (first refresh since: sent %v after it, answered in %v): %v", theft,
			lost.Round(time.Millisecond), first[0].Sub(at).Round(time.Millisecond), first[1].Sub(first[0]).Round(time.Millisecond), l.Err())
		if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
			t.Errorf("%s: Release after the theft = %v, want ErrNotHeld", theft, err)
		}
		if theft == "set" {
			if it, err := thief.Get(key); err != nil || string(it.Value) != "thief" {
				t.Errorf("the holder's release touched the thief's item (%v)", err)
			}
		}
	}
	t.Logf("TTL %v: worst time from theft to Lost %v (TTL/3 = %v)", ttl, worst.Round(time.Millisecond), ttl/3)
}
