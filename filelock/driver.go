package filelock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/lockerhq/locker/backend"
)

// Driver stores locks as files in one directory.
type Driver struct {
	dir  string
	sync bool
	clk  clock
	gate backend.Gate

	notifiers notifierPool  // idle inotify instances for waiters (Linux)
	woken     atomic.Uint64 // the kernel's wake-ups of our tickets (Linux): a lock's, one per release that hands it on
	tries     atomic.Uint64 // our tickets' looks at a lock (Linux), for internal/bench (measure.RegisterStoreTries)
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.Inspector      = (*Driver)(nil)
	_ backend.Lister         = (*Driver)(nil)
	_ backend.Breaker        = (*Driver)(nil)
	_ backend.Modal          = (*Driver)(nil)
)

// Modes implements backend.Modal: semaphores and read-write locks, each in
// its own file beside the lock's (object.go).
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher: a holder's weight is in the object
// file.
func (d *Driver) Weighs() bool { return true }

// New returns a driver on dir (made absolute, and created with mode 0700
// when missing).
func New(dir string, opts ...Option) (*Driver, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: directory %q: %w", dir, err)
	}
	// MkdirAll fails on a path that is there but no directory.
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	clk, err := systemClock()
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	cfg := config{sync: true}
	for _, o := range opts {
		o(&cfg)
	}
	if err := makeCounter(abs, cfg.sync); err != nil {
		return nil, err
	}
	return &Driver{dir: abs, sync: cfg.sync, clk: clk}, nil
}

// Dir returns the driver's directory.
func (d *Driver) Dir() string { return d.dir }

// maxBase bounds the escaped key in a file name, under the 255-byte limit
// of file names with room for the suffix.
const maxBase = 200

// Path returns the state file of key.
func (d *Driver) Path(key string) string { return d.objectPath(key, backend.Exclusive) }

// DefaultDir is the directory lockctl uses when no backend is configured:
// "lockctl" in the user's cache directory, or in the temporary directory
// when there is no cache directory.
func DefaultDir() string {
	base, err := os.UserCacheDir()
	if err != nil || base == "" {
		base = os.TempDir()
	}
	return filepath.Join(base, "lockctl")
}

// TryAcquire implements backend.Driver. A retry by the token that holds the
// lock succeeds again, with the same fence and a renewed TTL. A new fence
// comes from the directory's counter (above the file's own, which files of
// older versions counted).
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if l.Mode != backend.Exclusive {
		// A queued writer records itself only while it waits (its
		// Ticket): the locker package withdraws no failed try's record.
		return d.tryShared(ctx, l, !queuesWaiters)
	}
	var g backend.Grant
	var wake *os.File
	err := d.update(ctx, l.Key, true, func(r *record, now int64) (change, error) {
		if !d.live(r, now) && r.qhead < r.qtail {
			// A free lock goes to the queue's first live waiter.
			var ok bool
			if _, ok, wake = d.next(l.Key, r, now); ok {
				return write, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
		}
		return d.take(ctx, l, r, now, &g)
	})
	wake.Close() // wakes the next waiter, if any (see next)
	if err != nil {
		return backend.Grant{}, err
	}
	return g, nil
}

// take gives l the lock in r, unless another live token holds it. The
// queue is the caller's to check.
func (d *Driver) take(ctx context.Context, l backend.Claim, r *record, now int64, g *backend.Grant) (change, error) {
	tok := hashToken(l.Token)
	if d.live(r, now) && r.token != tok {
		return keep, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
	}
	if !d.live(r, now) {
		fence, err := d.nextFence(ctx, r.fence)
		if err != nil {
			return keep, err
		}
		r.fence = fence
	}
	r.expires = now + int64(l.TTL)
	r.boot = d.clk.boot
	r.token = tok
	r.pid = uint32(os.Getpid())
	r.owner = l.Owner
	*g = backend.Grant{Fence: r.fence, TTL: l.TTL}
	return write, nil
}

// Refresh implements backend.Driver.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	if l.Mode != backend.Exclusive {
		return d.refreshObject(ctx, l)
	}
	return d.update(ctx, l.Key, false, d.holds(l, func(r *record, now int64) change {
		r.expires = now + int64(l.TTL)
		return write
	}))
}

// RefreshMany implements backend.BatchRefresher: the locks are refreshed one
// after the other, in the calling goroutine.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	for i, l := range locks {
		errs[i] = d.Refresh(ctx, l)
	}
	return errs
}

// Release implements backend.Driver: it removes the key's file, so that a
// released name leaves nothing (its fences go on from the directory's
// counter), or, with waiters queued, keeps the lock free for the first.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	if l.Mode != backend.Exclusive {
		return d.releaseObject(ctx, l)
	}
	var wake *os.File
	err := d.update(ctx, l.Key, false, d.holds(l, func(r *record, now int64) (what change) {
		what, wake = d.free(l.Key, r, now)
		return what
	}))
	wake.Close() // wakes the next waiter, if any (see next)
	return err
}

// tryShared takes a claim in a mode besides Exclusive.
// A refused writer records itself as the waiting writer when record.
func (d *Driver) tryShared(ctx context.Context, l backend.Claim, record bool) (backend.Grant, error) {
	switch l.Mode {
	case backend.Permit:
		return d.trySemaphore(ctx, l)
	case backend.Read, backend.Write:
		return d.tryRW(ctx, l, record)
	}
	return backend.Grant{}, fmt.Errorf("filelock: %w: mode %v", backend.ErrUnsupported, l.Mode)
}

// holds wraps change so that it runs only when l's token holds the lock.
func (d *Driver) holds(l backend.Claim, then func(r *record, now int64) change) func(*record, int64) (change, error) {
	tok := hashToken(l.Token)
	return func(r *record, now int64) (change, error) {
		if !d.live(r, now) || r.token != tok {
			return keep, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		return then(r, now), nil
	}
}

// Close implements backend.Driver. Between calls the driver runs no
// goroutines and keeps no open files but, on Linux, its tickets' until
// they leave, and the inotify instances of its earlier waiters, for its
// next ones; Close waits for the calls in flight and closes those.
func (d *Driver) Close() error {
	d.gate.Close()
	d.notifiers.close()
	return nil
}
