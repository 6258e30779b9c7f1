package filelock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockerhq/locker/backend"
	"golang.org/x/sys/unix"
)

// enqueueShared tries c, a claim on a semaphore or a read-write lock, and
// when refused returns its watchTicket. A refused writer records itself
// as the waiting writer (backend.Modal) until its ticket leaves.
func (d *Driver) enqueueShared(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	sent := time.Now()
	g, err := d.tryShared(ctx, c, true)
	switch {
	case err == nil:
		g.Sent = sent
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, &watchTicket{d: d, c: c}, nil
	}
	return backend.Grant{}, nil, err
}

// watchTicket is a semaphore's or read-write lock's waiter. The object has
// no queue: the ticket watches its file (inotify), which releases, by any
// process, write or remove, and looks again when it changes, and at least
// every waitCap for holders that expired.
type watchTicket struct {
	d       *Driver
	c       backend.Claim
	notify  *notifier // nil until the first Wait
	watches []int     // to remove before notify goes back to the pool
	wait    time.Duration
}

// Wait implements backend.Ticket.
func (t *watchTicket) Wait(ctx context.Context) (backend.Grant, error) {
	ctx, leave, err := t.d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	if t.notify == nil {
		// The first Wait follows Enqueue's look at once: it watches, then
		// looks again, so that no release after that look is missed.
		if t.notify, err = t.d.notifiers.get(); err != nil {
			return backend.Grant{}, err
		}
	} else if _, err := t.notify.sleep(ctx, t.wait); err != nil {
		return backend.Grant{}, err
	}
	// Watched before the look, so that no release after it is missed; the
	// file may be another since the last look.
	path := t.d.objectPath(t.c.Key, t.c.Mode)
	t.wait = 2 * time.Millisecond // no file to watch: soon again
	if wd, err := unix.InotifyAddWatch(t.notify.fd, path, unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF); err == nil {
		if !slices.Contains(t.watches, wd) {
			t.watches = append(t.watches, wd)
		}
		t.wait = waitCap
	}
	if t.c.Mode == backend.Write {
		t.wait = min(t.wait, t.c.TTL/4) // its record is renewed in time
	}
	sent := time.Now()
	g, err := t.d.tryShared(ctx, t.c, true)
	if err == nil {
		g.Sent = sent
	} else if !errors.Is(err, backend.ErrNotAcquired) {
		t.wait = 0 // the locker package backed off: look at once
	}
	return g, err
}

// Leave implements backend.Ticket: a refused writer's record goes, as at
// a release, through a Close too.
func (t *watchTicket) Leave(ctx context.Context) error {
	if t.notify != nil {
		for _, wd := range t.watches {
			unix.InotifyRmWatch(t.notify.fd, uint32(wd))
		}
		t.d.notifiers.put(t.notify)
	}
	err := t.d.lockedObject(ctx, t.c, false, t.d.dropHold(t.c))
	if err == nil || errors.Is(err, errNoFile) || errors.Is(err, backend.ErrNotHeld) {
		return nil
	}
	return err
}
