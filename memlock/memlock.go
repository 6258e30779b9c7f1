// Package memlock is an in-process lock store: scheme mem://, for unit tests
// and single-process programs. Every driver opened on the same Store (or
// the same mem://NAME) sees the same locks, as clients of one server would.
//
// It passes the whole conformance suite: exact expiry, fencing tokens
// (a per-key counter kept for the Store's life) and release notifications.
// It does not reach across processes; use file:// or a server for that.
package memlock

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

func init() {
	backend.Register("mem", backend.Opener{
		Usage: "mem://[NAME]  (in-process; drivers opened with the same NAME share locks)",
		Open: func(ctx context.Context, u *url.URL) (backend.Driver, error) {
			if err := backend.NewParams(u).Err(); err != nil {
				return nil, fmt.Errorf("memlock: %w", err)
			}
			if u.Path != "" && u.Path != "/" || u.User != nil || u.Port() != "" {
				return nil, fmt.Errorf("memlock: %w: want mem://[NAME]", backend.ErrInvalidURL)
			}
			return New(Named(u.Host)), nil
		},
	})
}

// Store holds locks in memory.
type Store struct {
	mu     sync.Mutex
	locks  map[string]entry
	fences map[string]uint64
	subs   map[string]map[chan struct{}]struct{}
}

type entry struct {
	token   string
	expires time.Time
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{
		locks:  map[string]entry{},
		fences: map[string]uint64{},
		subs:   map[string]map[chan struct{}]struct{}{},
	}
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Named returns the process-wide Store called name, made on first use.
func Named(name string) *Store {
	namedMu.Lock()
	defer namedMu.Unlock()
	s := named[name]
	if s == nil {
		s = NewStore()
		named[name] = s
	}
	return s
}

// held returns the live entry on key; an expired one counts as free.
func (s *Store) held(key string, now time.Time) (entry, bool) {
	e, ok := s.locks[key]
	if ok && !now.Before(e.expires) {
		delete(s.locks, key)
		return entry{}, false
	}
	return e, ok
}

// Expire removes the lock on key as if its TTL had run out, and reports
// whether there was one.
func (s *Store) Expire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held(key, time.Now())
	delete(s.locks, key)
	s.notify(key)
	return ok
}

func (s *Store) notify(key string) {
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Driver is a client of a Store.
type Driver struct {
	s      *Store
	closed atomic.Bool
}

// New returns a driver on s.
func New(s *Store) *Driver { return &Driver{s: s} }

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.Notifier       = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
)

func (d *Driver) check(ctx context.Context) error {
	if d.closed.Load() {
		return fmt.Errorf("memlock: %w", backend.ErrClosed)
	}
	return ctx.Err()
}

// TryAcquire implements backend.Driver.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if err := d.check(ctx); err != nil {
		return backend.Grant{}, err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if _, ok := s.held(l.Key, now); ok {
		return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
	}
	s.locks[l.Key] = entry{token: l.Token, expires: now.Add(l.TTL)}
	s.fences[l.Key]++
	return backend.Grant{Fence: s.fences[l.Key], TTL: l.TTL}, nil
}

// Refresh implements backend.Driver.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refresh(l, time.Now())
}

func (s *Store) refresh(l backend.Claim, now time.Time) error {
	if e, ok := s.held(l.Key, now); !ok || e.token != l.Token {
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	s.locks[l.Key] = entry{token: l.Token, expires: now.Add(l.TTL)}
	return nil
}

// RefreshMany implements backend.BatchRefresher.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	if err := d.check(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, l := range locks {
		errs[i] = s.refresh(l, now)
	}
	return errs
}

// Release implements backend.Driver.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.held(l.Key, time.Now()); !ok || e.token != l.Token {
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
