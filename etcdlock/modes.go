package etcdlock

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

var _ backend.Modal = (*Driver)(nil)

// Modes implements backend.Modal: semaphores and read-write locks, each a
// queue of its own beside the lock's (see semaphore.go and rwlock.go).
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// modeDirs returns the directory of l's entry and the entries that may be
// ahead of it (a prefix), for a claim that is not Exclusive. The escaped
// key followed by '%' and a letter is never an escaped key (EscapeKey puts
// two hex digits after every '%'), so these directories never overlap a
// lock's queue, each other's, or another name's, and List skips them.
func (d *Driver) modeDirs(l backend.Claim) (dir, over string, err error) {
	base := d.prefix + "/" + backend.EscapeKey(l.Key)
	switch l.Mode {
	case backend.Permit:
		if l.Limit < 1 || l.Limit > backend.MaxLimit {
			return "", "", fmt.Errorf("%w: %d (want 1 to %d)", backend.ErrInvalidLimit, l.Limit, backend.MaxLimit)
		}
		dir = base + "%s/"
		return dir, dir, nil
	case backend.Read:
		// A reader waits for the writers ahead of it alone.
		return base + "%r/r/", base + "%r/w/", nil
	case backend.Write:
		// A writer waits for every entry ahead of it.
		return base + "%r/w/", base + "%r/", nil
	}
	return "", "", fmt.Errorf("%w: mode %v", backend.ErrUnsupported, l.Mode)
}

// acquireMode is acquire's step for a claim that is not Exclusive.
func (d *Driver) acquireMode(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim, over string, wait bool) (backend.Grant, error) {
	switch {
	case wait && l.Mode == backend.Permit:
		return d.enqueue(ctx, run, s, l, over, l.Limit)
	case wait:
		return d.enqueue(ctx, run, s, l, over, 0)
	case l.Mode == backend.Permit:
		return d.tryPermit(ctx, run, s, l)
	case l.Mode == backend.Read:
		return d.tryRead(ctx, run, s, l, over)
	}
	return d.try(ctx, run, s, l, over)
}
