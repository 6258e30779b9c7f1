package locker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// A LockSet is the locks on several names, taken all or nothing by
// AcquireAll, TryAcquireAll or DoAll and then held as one: released and
// refreshed together, and lost as soon as any of them is.
//
// The names are taken one at a time in one order, their byte order,
// whatever order the caller gives: two callers that ask for {a, b} and
// {b, a} at once cannot deadlock, since both queue for a first. A caller
// holds the names it has taken while it waits for the next (that is what
// keeps a waiter for {a, b} from being starved by single holders of b),
// and gives them all back when it cannot take the rest: nobody sees a part
// of the set held once the call has returned, except where the store did
// not confirm giving one back, which then stays held until its TTL, as any
// unconfirmed release does.
type LockSet struct {
	locks []*Lock // in the names' byte order
	lost  chan struct{}
	once  sync.Once
	stops []func()
}

// AcquireAll takes the locks on every name, waiting for each in turn (see
// LockSet), with opts applied to each. WaitAtMost bounds the wait for the
// whole set. It returns an error wrapping ErrNotAcquired, with the name it
// could not take, when a wait ends without the lock; every lock it took is
// released by then. Duplicate names count once.
func (c *Client) AcquireAll(ctx context.Context, names []string, opts ...LockOption) (*LockSet, error) {
	return c.acquireAll(ctx, names, true, opts)
}

// TryAcquireAll takes the locks on every name if all are free, and
// otherwise returns an error wrapping ErrNotAcquired that names the first
// held one, holding none of them.
func (c *Client) TryAcquireAll(ctx context.Context, names []string, opts ...LockOption) (*LockSet, error) {
	return c.acquireAll(ctx, names, false, opts)
}

// DoAll is Do for a set of names: it takes them as AcquireAll does, runs fn
// with a context that is cancelled, with the loss as its cause, if any of
// them is lost, and releases them all on every path. fn gets the set, for
// its fences.
func (c *Client) DoAll(ctx context.Context, names []string, fn func(context.Context, *LockSet) error, opts ...LockOption) (err error) {
	s, err := c.acquireAll(ctx, names, true, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stops := make([]func(), len(s.locks))
	for i, l := range s.locks {
		stops[i] = l.h.afterLost(cancel)
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
		rerr := s.Release(ctx)
		if lost := s.Err(); lost != nil {
			if !errors.Is(err, lost) {
				err = errors.Join(err, lost)
			}
		} else {
			err = errors.Join(err, rerr)
		}
	}()
	return fn(fctx, s)
}

func (c *Client) acquireAll(ctx context.Context, names []string, wait bool, opts []LockOption) (*LockSet, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("locker: a lock set needs at least one name: %w", ErrInvalidName)
	}
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		if err := CheckName(n); err != nil {
			return nil, err
		}
	}
	var lc lockConfig
	for _, o := range opts {
		o(&lc)
	}
	if wait && lc.waitSet {
		if lc.waitMax <= 0 {
			wait = false
		} else {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, lc.waitMax)
			defer cancel()
		}
		// The set's wait is bounded once, not name by name.
		opts = append(slices.Clip(opts), func(c *lockConfig) { c.waitSet = false })
	}
	s := &LockSet{locks: make([]*Lock, 0, len(names)), lost: make(chan struct{})}
	for _, n := range names {
		l, err := c.acquire(ctx, n, wait, opts)
		if err == nil {
			s.locks = append(s.locks, l)
			// A name taken earlier may have been lost while this one was
			// awaited: the set is not held then.
			err = s.Err()
			if err != nil {
				err = fmt.Errorf("locker: lock set: %w: %w", ErrNotAcquired, err)
			}
		}
		if err != nil {
			return nil, errors.Join(err, s.giveBack(ctx))
		}
	}
	for _, l := range s.locks {
		s.stops = append(s.stops, l.h.afterLost(func(error) { s.once.Do(func() { close(s.lost) }) }))
	}
	return s, nil
}

// giveBack releases the locks taken so far, after a failed acquisition.
func (s *LockSet) giveBack(ctx context.Context) error {
	var errs []error
	for _, l := range slices.Backward(s.locks) {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Names returns the set's names, in the order they were taken.
func (s *LockSet) Names() []string {
	names := make([]string, len(s.locks))
	for i, l := range s.locks {
		names[i] = l.Name()
	}
	return names
}

// Fence returns the fencing token of name's lock (see Lock.Fence), or 0
// when name is not in the set.
func (s *LockSet) Fence(name string) uint64 {
	i, ok := slices.BinarySearchFunc(s.locks, name, func(l *Lock, n string) int { return strings.Compare(l.Name(), n) })
	if !ok {
		return 0
	}
	return s.locks[i].Fence()
}

// Lost returns a channel that is closed as soon as any lock of the set is
// known lost (see Lock.Lost). It is not closed by Release.
func (s *LockSet) Lost() <-chan struct{} { return s.lost }

// Err returns nil while no lock of the set is known lost, then the first
// lost one's error, which names it.
func (s *LockSet) Err() error {
	for _, l := range s.locks {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return nil
}

// TTL returns the shortest of the locks' TTLs (see Lock.TTL).
func (s *LockSet) TTL() time.Duration {
	var d time.Duration
	for _, l := range s.locks {
		if t := l.TTL(); d == 0 || t < d {
			d = t
		}
	}
	return d
}

// Deadline returns the earliest of the locks' deadlines (see
// Lock.Deadline).
func (s *LockSet) Deadline() time.Time {
	var d time.Time
	for _, l := range s.locks {
		if t := l.Deadline(); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

// Refresh refreshes every lock of the set, as Lock.Refresh does, and
// returns their errors joined.
func (s *LockSet) Refresh(ctx context.Context) error {
	var errs []error
	for _, l := range s.locks {
		errs = append(errs, l.Refresh(ctx))
	}
	return errors.Join(errs...)
}

// Release releases every lock of the set, in the reverse of the order they
// were taken, as Lock.Release does (it too outlives ctx), and returns their
// errors joined. A second Release returns one error wrapping ErrNotHeld.
func (s *LockSet) Release(ctx context.Context) error {
	if len(s.locks) > 0 && s.locks[0].released.Load() {
		return fmt.Errorf("locker: release lock set: %w: released already", ErrNotHeld)
	}
	for _, stop := range s.stops {
		stop()
	}
	var errs []error
	for _, l := range slices.Backward(s.locks) {
		errs = append(errs, l.Release(ctx))
	}
	return errors.Join(errs...)
}
