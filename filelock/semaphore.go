package filelock

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
)

// trySemaphore grants c.Weight of c.Limit permits (backend.Modal): while
// the holders' weights and c's are at most the limit, and only under the
// holders' limit; under the one Resize set instead, when it stands.
func (d *Driver) trySemaphore(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if c.Limit < 1 || c.Limit > backend.MaxLimit {
		return backend.Grant{}, fmt.Errorf("filelock: %w: %d", backend.ErrInvalidLimit, c.Limit)
	}
	return d.tryObject(ctx, c, func(o *object, _ [32]byte, _ int64) (bool, error) {
		limit, err := d.readLimit(c.Key)
		switch {
		case err != nil:
			return false, err
		case limit == 0:
			limit = c.Limit
			if len(o.holders) > 0 && o.limit != limit {
				return false, fmt.Errorf("filelock: %w", backend.HeldUnder(o.limit, limit))
			}
		case max(c.Weight, 1) > limit:
			return false, fmt.Errorf("filelock: %w", backend.ResizedTo(c.Weight, limit))
		}
		used := 0
		for _, h := range o.holders {
			used += h.weight
		}
		if used+max(c.Weight, 1) > limit {
			return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
		}
		o.limit = limit
		return true, nil
	})
}
