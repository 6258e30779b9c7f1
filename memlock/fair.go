package memlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockerhq/locker/backend"
)

// FairDriver is a Driver whose waiters are served in arrival order, from
// a queue the Store keeps per lock, semaphore and read-write lock
// (backend.Queuer). It is what a store's queue costs a driver: Enqueue,
// Wait and Leave, and no waiting loop of its own. A TryAcquire, on any
// driver of the Store, is refused while the object has waiters.
type FairDriver struct{ *Driver }

// NewFair returns a FairDriver on s; see New.
func NewFair(s *Store) (*FairDriver, error) {
	d, err := New(s)
	if err != nil {
		return nil, err
	}
	return &FairDriver{d}, nil
}

var _ backend.Queuer = (*FairDriver)(nil)

// queued is a waiter's entry; turn wakes it when it may be first.
type queued struct{ turn chan struct{} }

// QueueModes implements backend.Queuer: every mode queues.
func (d *FairDriver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Enqueue implements backend.Queuer.
func (d *FairDriver) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	if err := d.check(ctx); err != nil {
		return backend.Grant{}, nil, err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	o := objectOf(c)
	if len(s.queues[o]) == 0 {
		g, err := s.grant(c, time.Now())
		if !errors.Is(err, backend.ErrNotAcquired) {
			return g, nil, err
		}
	}
	w := &queued{turn: make(chan struct{}, 1)}
	s.queues[o] = append(s.queues[o], w)
	return backend.Grant{}, &ticket{d, c, w}, nil
}

type ticket struct {
	d *FairDriver
	c backend.Claim
	w *queued
}

// Wait implements backend.Ticket: the first waiter looks when woken by a
// release or at a holder's expiry, which frees the object unannounced.
func (t *ticket) Wait(ctx context.Context) (backend.Grant, error) {
	s, o := t.d.s, objectOf(t.c)
	s.mu.Lock()
	wake := time.Hour
	if s.first(o, t.w) {
		wake = time.Until(s.expires(o, time.Now()))
	}
	s.mu.Unlock()
	timer := time.NewTimer(wake)
	defer timer.Stop()
	select {
	case <-t.w.turn:
	case <-timer.C:
	case <-ctx.Done():
	}
	if err := t.d.check(ctx); err != nil {
		return backend.Grant{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.first(o, t.w) {
		return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
	}
	now := time.Now()
	g, err := s.grant(t.c, now)
	if err == nil {
		s.dequeue(o, t.w)
		g.Sent = now
	}
	return g, err
}

// first reports whether w is first in o's queue.
func (s *Store) first(o object, w *queued) bool {
	q := s.queues[o]
	return len(q) > 0 && q[0] == w
}

// Leave implements backend.Ticket; it works on a closed driver too, so
// that nobody waits behind the entry.
func (t *ticket) Leave(context.Context) error {
	s := t.d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dequeue(objectOf(t.c), t.w)
	// Whatever reached the entry: a release checks the token.
	_ = s.release(t.c, time.Now())
	return nil
}

// expires is when a holder of o expires next, or the waiting writer's
// record: a moment at which o may become free unannounced.
func (s *Store) expires(o object, now time.Time) time.Time {
	if o.kind == backend.Exclusive {
		e, _ := s.held(o.key, now)
		return e.expires
	}
	next := now.Add(time.Hour)
	if sh := s.live(o, now); sh != nil {
		for _, e := range sh.holders {
			if e.expires.Before(next) {
				next = e.expires
			}
		}
		if sh.waiting != "" && sh.until.Before(next) {
			next = sh.until
		}
	}
	return next
}

// dequeue removes w from o's queue and wakes the new first waiter.
func (s *Store) dequeue(o object, w *queued) {
	q := slices.DeleteFunc(s.queues[o], func(x *queued) bool { return x == w })
	if len(q) == 0 {
		delete(s.queues, o)
		return
	}
	s.queues[o] = q
	s.wakeFirst(o)
}

// wakeFirst wakes o's first waiter, if any.
func (s *Store) wakeFirst(o object) {
	if q := s.queues[o]; len(q) > 0 {
		select {
		case q[0].turn <- struct{}{}:
		default:
		}
	}
}
