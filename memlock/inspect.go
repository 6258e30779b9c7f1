package memlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// known is what a memlock entry records: everything but a queue, which
// memlock does not keep (waiters are notified, not queued).
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL

func (e entry) state(key string, now time.Time) backend.State {
	return backend.State{Key: key, Held: true, Owner: e.owner, Fence: e.fence, TTL: e.expires.Sub(now), Known: known}
}

// Inspect implements backend.Inspector.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	if err := d.check(ctx); err != nil {
		return backend.State{}, err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if e, ok := s.held(key, now); ok {
		return e.state(key, now), nil
	}
	return backend.State{Key: key, Known: known}, nil
}

// List implements backend.Lister.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	s := d.s
	s.mu.Lock()
	now := time.Now()
	var out []backend.State
	for key := range s.locks {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		if e, ok := s.held(key, now); ok {
			out = append(out, e.state(key, now))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b backend.State) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Break implements backend.Breaker. Fences come from the store's one
// counter, so the next grant's is above the removed one's.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	if err := d.check(ctx); err != nil {
		return backend.State{}, err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	e, ok := s.held(key, now)
	if !ok || e.fence != fence {
		return backend.State{}, fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	delete(s.locks, key)
	s.notify(key)
	return e.state(key, now), nil
}
