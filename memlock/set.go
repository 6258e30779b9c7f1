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
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) (grants []backend.Grant, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		for _, l := range claims {
			if len(s.queues[objectOf(l)]) > 0 {
				return fmt.Errorf("memlock: %w: waiters queued", backend.ErrNotAcquired)
			}
			if _, ok := s.held(l.Key, now); ok {
				return fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
			}
		}
		grants = make([]backend.Grant, len(claims))
		for i, l := range claims {
			grants[i], _ = s.grant(l, now) // free, as just seen
		}
		return nil
	})
	return grants, err
}

// ReleaseAll implements backend.SetAcquirer.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	return d.each(ctx, claims, (*Store).release)
}
