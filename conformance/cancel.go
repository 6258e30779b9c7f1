package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// Bounds of cancelCrossed: rounds, and the time they may take together
// (a round takes a few round trips and a few milliseconds).
const (
	crossedRounds = 120
	crossedFor    = 3 * time.Second
)

// cancelCrossed: once an Acquire or TryAcquire whose context was cancelled
// has returned an error, the name is free for anyone at once. Nothing the
// call sent may hold it afterwards: not a grant the store made as the
// caller gave up, not one that lands after the call returned, not a queue
// entry. The cancels cross grants: in some rounds the name is free and the
// call is cancelled 0-500µs in, as its request goes out or its grant comes
// back; in the others a holder releases the name up to a millisecond
// before or after a cancel 0-3ms in, so that a waiter's grant and its
// cancel meet. A call that returns a lock instead has won the race; it is
// released and the rounds go on.
func (s *suite) cancelCrossed(t *testing.T) {
	ctx := s.ctx(t)
	holder, caller, checker := s.client(t), s.client(t), s.client(t)
	name := s.name(t, "x")
	var cancelled, won, other int
	start := time.Now()
	for i := 0; i < crossedRounds && time.Since(start) < crossedFor; i++ {
		r := crossedRound(i)
		// Free at the start of every round: nothing an earlier round's
		// cancelled call sent may land later either.
		var l *locker.Lock
		if r.held {
			var err error
			if l, err = holder.TryAcquire(ctx, name); err != nil {
				t.Fatalf("round %d: the holder's TryAcquire at the start of the round (the name was free after round %d): %v", i, i-1, err)
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		released := make(chan error, 1)
		if r.held {
			time.AfterFunc(r.releaseAt, func() { released <- l.Release(ctx) })
		}
		stop := time.AfterFunc(r.cancelAt, cancel)
		var got *locker.Lock
		var err error
		if r.wait {
			got, err = caller.Acquire(cctx, name)
		} else {
			got, err = caller.TryAcquire(cctx, name)
		}
		returned := time.Now()
		stop.Stop()
		cancel()
		if r.held {
			if rerr := <-released; rerr != nil {
				t.Fatalf("round %d (%s): the holder's Release: %v", i, r, rerr)
			}
		}
		switch {
		case err == nil:
			won++
			mustRelease(t, ctx, got)
		case errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, context.Canceled):
			cancelled++
		default:
			// Not what a cancelled call should say (CancelReturnsPromptly
			// holds Acquire to that); what matters here is what it left.
			cancelled++
			if other++; other <= 3 {
				t.Logf("round %d (%s): the call returned %v, which says neither ErrNotAcquired nor Canceled", i, r, err)
			}
		}
		// The cancelled call has returned and the holder has released:
		// the name is free.
		c, cerr := checker.TryAcquire(ctx, name)
		if cerr != nil {
			after := time.Since(returned)
			t.Fatalf("round %d (%s): the call returned %v; %v later, with the holder's lock released, another client's TryAcquire = %v, want the lock (%s)",
				i, r, err, after.Round(time.Microsecond), cerr, s.heldFor(ctx, checker, name, returned))
		}
		mustRelease(t, ctx, c)
	}
	t.Logf("%d rounds in %v: %d cancelled calls (%d with another error), %d won the race", cancelled+won, time.Since(start).Round(time.Millisecond), cancelled, other, won)
}

// crossed is one round of cancelCrossed.
type crossed struct {
	wait      bool          // Acquire, else TryAcquire
	held      bool          // a holder releases around the cancel, else the name is free
	cancelAt  time.Duration // after the call begins
	releaseAt time.Duration // the holder's release, after the call begins
}

func (r crossed) String() string {
	call := "TryAcquire"
	if r.wait {
		call = "Acquire"
	}
	if !r.held {
		return fmt.Sprintf("%s on a free name, cancelled %v in", call, r.cancelAt)
	}
	return fmt.Sprintf("%s on a held name, cancelled %v in, the holder's release %v in", call, r.cancelAt, r.releaseAt)
}

// crossedRound spreads the rounds' offsets evenly, without randomness, so
// that a failure names a round that can be run again.
func crossedRound(i int) crossed {
	r := crossed{wait: i%2 == 1, held: i%3 != 0}
	if !r.held {
		r.cancelAt = time.Duration(i*37%500) * time.Microsecond
		return r
	}
	r.cancelAt = time.Duration(i*131%3000) * time.Microsecond
	r.releaseAt = max(r.cancelAt+time.Duration(i*53%2000-1000)*time.Microsecond, 0)
	return r
}

// heldFor says how long after since the name stayed held, looking until
// twice the TTL and the store's slack have passed: what a failure left.
func (s *suite) heldFor(ctx context.Context, c *locker.Client, name string, since time.Time) string {
	deadline := time.Now().Add(2*s.ttl() + s.slack())
	for time.Now().Before(deadline) {
		l, err := c.TryAcquire(ctx, name)
		if err == nil {
			at := time.Since(since)
			l.Release(ctx)
			return fmt.Sprintf("it was free %v after the call returned", at.Round(time.Millisecond))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Sprintf("it was still held %v after the call returned", time.Since(since).Round(time.Millisecond))
}

// lockSetCancelled is cancelCrossed for lock sets: once an AcquireAll or
// TryAcquireAll whose context was cancelled has returned an error, none
// of its names is held, whatever moment of the set's requests the cancel
// met; the holder's name (the set's middle one) is released around it.
func (s *suite) lockSetCancelled(t *testing.T) {
	ctx := s.ctx(t)
	holder, caller, checker := s.client(t), s.client(t), s.client(t)
	names := []string{s.name(t, "a"), s.name(t, "b"), s.name(t, "c")}
	var cancelled, won int
	start := time.Now()
	for i := 0; i < crossedRounds && time.Since(start) < crossedFor; i++ {
		r := crossedRound(i)
		var l *locker.Lock
		if r.held {
			var err error
			if l, err = holder.TryAcquire(ctx, names[1]); err != nil {
				t.Fatalf("round %d: the holder's TryAcquire at the start of the round: %v", i, err)
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		released := make(chan error, 1)
		if r.held {
			time.AfterFunc(r.releaseAt, func() { released <- l.Release(ctx) })
		}
		stop := time.AfterFunc(r.cancelAt, cancel)
		take := caller.TryAcquireAll
		if r.wait {
			take = caller.AcquireAll
		}
		set, err := take(cctx, names)
		returned := time.Now()
		stop.Stop()
		cancel()
		if r.held {
			if rerr := <-released; rerr != nil {
				t.Fatalf("round %d (%s): the holder's Release: %v", i, r, rerr)
			}
		}
		if err == nil {
			won++
			if err := set.Release(ctx); err != nil {
				t.Fatalf("round %d (%s): the set's Release: %v", i, r, err)
			}
		} else {
			cancelled++
		}
		for _, n := range names {
			c, cerr := checker.TryAcquire(ctx, n)
			if cerr != nil {
				t.Fatalf("round %d (%s, a set): the call returned %v; %v later, another client's TryAcquire(%q) = %v, want the lock (%s)",
					i, r, err, time.Since(returned).Round(time.Microsecond), n, cerr, s.heldFor(ctx, checker, n, returned))
			}
			mustRelease(t, ctx, c)
		}
	}
	t.Logf("%d rounds in %v: %d cancelled calls, %d won the race", cancelled+won, time.Since(start).Round(time.Millisecond), cancelled, won)
}
