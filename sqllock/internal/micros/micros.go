// Package micros converts TTLs to the whole microseconds that every SQL
// dialect's tables count.
package micros

import (
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Of returns ttl in whole microseconds, rounded up, or an error wrapping
// backend.ErrInvalidTTL that starts with prefix ("sqllock: ").
func Of(prefix string, ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("%s%w: %v", prefix, backend.ErrInvalidTTL, ttl)
	}
	us := int64(ttl / time.Microsecond)
	if ttl%time.Microsecond != 0 {
		us++ // not ttl + 999ns first, which wraps near the largest Duration
	}
	return us, nil
}
