package bench

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Counter counts the refreshes that reach a driver.
//
// Wrapping a driver hides the optional interfaces it implements, and the
// locker package finds them by type assertion. Count therefore returns a
// wrapper that implements exactly the optional interfaces that change how
// locks are kept alive, backend.Session and backend.BatchRefresher, when
// the driver does. It does not forward backend.Queuer nor
// backend.Notifier: the held-lock workload, the only one that counts,
// never waits.
type Counter struct {
	refreshed atomic.Int64 // locks refreshed, by Refresh or RefreshMany
	calls     atomic.Int64 // Refresh and RefreshMany calls
	session   bool
	batch     bool
}

// Refreshed returns how many locks were refreshed, and in how many calls.
func (c *Counter) Refreshed() (locks, calls int64) { return c.refreshed.Load(), c.calls.Load() }

// Count wraps drv so that c counts its refreshes.
func Count(drv backend.Driver) (c *Counter, wrapped backend.Driver) {
	c = &Counter{}
	base := &counting{Driver: drv, c: c}
	s, isSession := drv.(backend.Session)
	b, isBatch := drv.(backend.BatchRefresher)
	c.session, c.batch = isSession, isBatch
	switch {
	case isSession && isBatch:
		return c, &countingSessionBatch{countingBatch{base, b}, s}
	case isSession:
		return c, &countingSession{base, s}
	case isBatch:
		return c, &countingBatch{base, b}
	default:
		return c, base
	}
}

type counting struct {
	backend.Driver
	c *Counter
}

func (d *counting) Refresh(ctx context.Context, l backend.Claim) error {
	d.c.refreshed.Add(1)
	d.c.calls.Add(1)
	return d.Driver.Refresh(ctx, l)
}

type countingBatch struct {
	*counting
	b backend.BatchRefresher
}

func (d *countingBatch) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	d.c.refreshed.Add(int64(len(locks)))
	d.c.calls.Add(1)
	return d.b.RefreshMany(ctx, locks)
}

type countingSession struct {
	*counting
	s backend.Session
}

func (d *countingSession) SessionTTL() time.Duration { return d.s.SessionTTL() }

type countingSessionBatch struct {
	countingBatch
	s backend.Session
}

func (d *countingSessionBatch) SessionTTL() time.Duration { return d.s.SessionTTL() }
