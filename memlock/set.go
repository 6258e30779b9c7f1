package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

var _ backend.SetAcquirer = (*Driver)(nil)

// TryAcquireAll implements backend.SetAcquirer: under the store's one
// mutex, every claim is granted, or none.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, l := range claims {
		if len(s.queues[objectOf(l)]) > 0 {
			return nil, fmt.Errorf("memlock: %w: waiters queued", backend.ErrNotAcquired)
		}
		if _, ok := s.held(l.Key, now); ok {
			return nil, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
		}
	}
	grants := make([]backend.Grant, len(claims))
	for i, l := range claims {
		grants[i], _ = s.grant(l, now) // free, as just seen
	}
	return grants, nil
}

// ReleaseAll implements backend.SetAcquirer.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	return d.each(ctx, claims, (*Store).release)
}
