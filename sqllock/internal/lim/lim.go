// Package lim packs a permit holder's weight into the lim column of the
// shared tables, beside its semaphore's limit: no schema change, and a
// holder of one permit keeps the bare limit that older versions wrote.
// An older version that meets a heavier holder reads another limit and
// refuses with ErrLimitMismatch: it never over-grants.
package lim

import (
	"fmt"

	"github.com/lockerhq/locker/backend"
)

// Step is what each permit beyond the first adds to lim: above
// backend.MaxLimit, so lim % Step is the limit, and lim / Step + 1 the
// weight. Every lim is below MaxLimit * Step, which fits an int4.
const Step = 16384

// Of returns the lim of a holder of c's weight of c.Limit permits, or an
// error wrapping backend.ErrInvalidLimit that starts with prefix.
func Of(prefix string, c backend.Claim) (int, error) {
	w := max(c.Weight, 1)
	if c.Limit < 1 || c.Limit > backend.MaxLimit || w > c.Limit {
		return 0, fmt.Errorf("%s%w: %d of %d permits, want 1 to %d of 1 to %d", prefix, backend.ErrInvalidLimit, w, c.Limit, c.Limit, backend.MaxLimit)
	}
	return c.Limit + (w-1)*Step, nil
}

// Split returns the limit and the weight of a holder's lim.
func Split(lim int) (limit, weight int) { return lim % Step, lim/Step + 1 }
