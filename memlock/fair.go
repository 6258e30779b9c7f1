package memlock

import (
	"context"
	"errors"
	"fmt"
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

// QueueModes implements backend.Queuer: every mode queues.
func (d *FairDriver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Enqueue implements backend.Queuer.
func (d *FairDriver) Enqueue(ctx context.Context, c backend.Claim) (g backend.Grant, t backend.Ticket, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		o := objectOf(c)
		if len(s.queues[o]) == 0 {
			if g, err = s.grant(c, now); !errors.Is(err, backend.ErrNotAcquired) {
				return err
			}
		}
		tk := &ticket{d, c, make(chan struct{}, 1)}
		s.queues[o], t = append(s.queues[o], tk), tk
		return nil
	})
	return g, t, err
}

// ticket is a waiter's entry; turn wakes it when it may be first.
type ticket struct {
	d    *FairDriver
	c    backend.Claim
	turn chan struct{}
}

// Wait implements backend.Ticket: a waiter looks when a release wakes
// it, and every recheck, since a holder that expires frees the object
// unannounced.
func (t *ticket) Wait(ctx context.Context) (backend.Grant, error) {
	timer := time.NewTimer(recheck)
	defer timer.Stop()
	select {
	case <-t.turn:
	case <-timer.C:
	case <-ctx.Done():
	}
	var g backend.Grant
	err := t.d.locked(ctx, func(s *Store, now time.Time) (err error) {
		o := objectOf(t.c)
		if s.queues[o][0] != t {
			return fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
		}
		if g, err = s.grant(t.c, now); err == nil {
			s.dequeue(o, t)
			g.Sent = now
		}
		return err
	})
	return g, err
}

const recheck = 20 * time.Millisecond

// Leave implements backend.Ticket; it works on a closed driver too, so
// that nobody waits behind the entry.
func (t *ticket) Leave(context.Context) error {
	s := t.d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dequeue(objectOf(t.c), t)
	// Whatever reached the entry: a release checks the token.
	_ = s.release(t.c, time.Now())
	return nil
}
