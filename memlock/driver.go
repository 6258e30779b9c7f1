package memlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Driver is a client of a Store.
type Driver struct {
	s      *Store
	closed atomic.Bool
}

// New returns a driver on s, a Store the caller keeps: drivers on the same
// Store share its locks. Close does not empty s. A nil s is an error that
// wraps backend.ErrInvalidOption.
func New(s *Store) (*Driver, error) {
	if s == nil {
		return nil, fmt.Errorf("memlock: New: %w: nil Store", backend.ErrInvalidOption)
	}
	return &Driver{s: s}, nil
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.Notifier       = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.Inspector      = (*Driver)(nil)
	_ backend.Lister         = (*Driver)(nil)
	_ backend.Breaker        = (*Driver)(nil)
	_ backend.Modal          = (*Driver)(nil)
	_ backend.Weigher        = (*Driver)(nil)
)

// Modes implements backend.Modal: semaphores and read-write locks.
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher: a claim takes its weight in permits.
func (d *Driver) Weighs() bool { return true }

func (d *Driver) check(ctx context.Context) error {
	if d.closed.Load() {
		return fmt.Errorf("memlock: %w", backend.ErrClosed)
	}
	return ctx.Err()
}

// locked runs f under the store's mutex, at one now, unless d is closed or
// ctx is done.
func (d *Driver) locked(ctx context.Context, f func(s *Store, now time.Time) error) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	return f(d.s, time.Now())
}

// TryAcquire implements backend.Driver.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (g backend.Grant, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		if len(s.queues[objectOf(l)]) > 0 {
			return fmt.Errorf("memlock: %w: waiters queued", backend.ErrNotAcquired)
		}
		g, err = s.grant(l, now)
		return err
	})
	return g, err
}

// grant takes l's object if its mode's rule allows.
func (s *Store) grant(l backend.Claim, now time.Time) (backend.Grant, error) {
	if l.Mode != backend.Exclusive {
		return s.tryShared(l, now)
	}
	if _, ok := s.held(l.Key, now); ok {
		return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
	}
	s.fence++
	s.locks[l.Key] = entry{token: l.Token, owner: l.Owner, fence: s.fence, expires: now.Add(l.TTL)}
	return backend.Grant{Fence: s.fence, TTL: l.TTL}, nil
}

// Refresh implements backend.Driver.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	return d.locked(ctx, func(s *Store, now time.Time) error { return s.refresh(l, now) })
}

func (s *Store) refresh(l backend.Claim, now time.Time) error {
	if l.Mode != backend.Exclusive {
		return s.refreshShared(l, now)
	}
	e, ok := s.held(l.Key, now)
	if !ok || e.token != l.Token {
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	e.expires = now.Add(l.TTL)
	s.locks[l.Key] = e
	return nil
}

// RefreshMany implements backend.BatchRefresher.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	return d.each(ctx, locks, (*Store).refresh)
}

// each runs f for every claim under the store's mutex: one error per claim.
func (d *Driver) each(ctx context.Context, claims []backend.Claim, f func(*Store, backend.Claim, time.Time) error) []error {
	errs := make([]error, len(claims))
	err := d.locked(ctx, func(s *Store, now time.Time) error {
		for i, l := range claims {
			errs[i] = f(s, l, now)
		}
		return nil
	})
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// Release implements backend.Driver.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	return d.locked(ctx, func(s *Store, now time.Time) error { return s.release(l, now) })
}

func (s *Store) release(l backend.Claim, now time.Time) error {
	if l.Mode != backend.Exclusive {
		return s.releaseShared(l, now)
	}
	if e, ok := s.held(l.Key, now); !ok || e.token != l.Token {
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	delete(s.locks, l.Key)
	s.notify(l.Key)
	return nil
}

// Subscribe implements backend.Notifier.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := d.check(ctx); err != nil {
		return nil, nil, err
	}
	ch := make(chan struct{}, 1)
	s := d.s
	s.mu.Lock()
	if s.subs[key] == nil {
		s.subs[key] = map[chan struct{}]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.subs[key], ch)
			if len(s.subs[key]) == 0 {
				delete(s.subs, key)
			}
			s.mu.Unlock()
		})
	}, nil
}

// Close implements backend.Driver.
func (d *Driver) Close() error {
	d.closed.Store(true)
	return nil
}
