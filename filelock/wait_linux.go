package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"golang.org/x/sys/unix"
)

// On Linux the driver queues waiters (queue.go) and the kernel wakes them:
// backend.Queuer. Elsewhere the locker package polls.
var _ backend.Queuer = (*Driver)(nil)

// queuesWaiters says that the driver is a backend.Queuer.
const queuesWaiters = true

// waitCap bounds a waiter's sleep without a wake-up: it then looks
// itself, for a woken waiter that died or stalled before taking the lock
// (the others are not told), or an expired holder.
const waitCap = 250 * time.Millisecond

// waiter is a lock's ticket's place in the queue: its number and its
// file, flocked while queued, which the ticket's notifier watches.
type waiter struct {
	ticket  uint64
	path    string
	file    *os.File
	dropped bool
}

// A notifier is an inotify instance, non-blocking, so that reads honour
// deadlines. Closing one takes the kernel milliseconds: a driver keeps
// them for its next waiters (notifierPool), with no watch left.
type notifier struct {
	f  *os.File
	fd int // f's descriptor (f.Fd would make f blocking)
}

// notifierPool keeps a driver's idle notifiers, up to maxIdleNotifiers.
type notifierPool struct {
	mu     sync.Mutex
	idle   []*notifier
	closed bool
}

const maxIdleNotifiers = 64

func (p *notifierPool) get() (*notifier, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		nt := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		nt.drain()
		return nt, nil
	}
	p.mu.Unlock()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("filelock: inotify: %w", err)
	}
	return &notifier{f: os.NewFile(uintptr(fd), "inotify"), fd: fd}, nil
}

func (p *notifierPool) put(nt *notifier) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleNotifiers {
		p.idle = append(p.idle, nt)
		nt = nil
	}
	p.mu.Unlock()
	if nt != nil {
		nt.f.Close()
	}
}

func (p *notifierPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, nt := range idle {
		nt.f.Close()
	}
}

// drain discards the events left from an earlier use (a late wake-up, a
// removed watch): at worst one more comes later, and costs a look.
func (nt *notifier) drain() {
	var buf [4096]byte
	for {
		if _, err := unix.Read(nt.fd, buf[:]); err != nil {
			return
		}
	}
}

// QueueModes implements backend.Queuer: every mode, though only a lock's
// waiters are served in order (see ticket).
func (d *Driver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Enqueue implements backend.Queuer: the claim is granted at once when it
// may be (a lock free with nobody queued); otherwise it returns the
// claim's ticket, queued for a lock, and for a refused writer recorded
// as the waiting writer (backend.Modal) until it leaves.
func (d *Driver) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, nil, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	t := &ticket{d: d, c: c}
	g, err := t.look(ctx)
	switch {
	case err == nil:
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, t, nil
	case t.w != nil:
		return backend.Grant{}, t, err // queued, and the record's write failed
	}
	t.free()
	return backend.Grant{}, nil, err
}

// ticket is a waiter's: a lock's has a place in its queue (queue.go); an
// object's watches the object's file, which releases write or remove.
type ticket struct {
	d       *Driver
	c       backend.Claim
	notify  *notifier     // nil until it queues or watches
	w       *waiter       // a lock's place in its queue, while it has one
	watches []int         // to remove before notify goes back to the pool
	until   time.Duration // the longest sleep before the next look
}

// Wait implements backend.Ticket.
func (t *ticket) Wait(ctx context.Context) (backend.Grant, error) {
	ctx, leave, err := t.d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	if t.notify == nil {
		// An object's first Wait follows Enqueue's look at once: it
		// watches, then looks again, so that no release is missed.
		if t.notify, err = t.d.notifiers.get(); err != nil {
			return backend.Grant{}, err
		}
	} else if woke, err := t.notify.sleep(ctx, t.until); err != nil {
		return backend.Grant{}, err
	} else if woke {
		t.d.woken.Add(1)
	}
	return t.look(ctx)
}

// look looks once: a lock's turn, or a try at an object once watched.
func (t *ticket) look(ctx context.Context) (backend.Grant, error) {
	sent := time.Now()
	var g backend.Grant
	var err error
	if t.c.Mode == backend.Exclusive {
		t.d.tries.Add(1)
		g, err = t.turn(ctx)
	} else {
		t.watch()
		g, err = t.d.tryShared(ctx, t.c, true)
	}
	switch {
	case err == nil:
		g.Sent = sent
		t.free()
	case !errors.Is(err, backend.ErrNotAcquired):
		t.until = 0 // the locker package backed off: look at once
	}
	return g, err
}

// watch watches an object's file, before a look, so that no release after
// it is missed: the file may be another since the last look.
func (t *ticket) watch() {
	if t.notify == nil {
		return // Enqueue's look
	}
	t.until = 2 * time.Millisecond // no file to watch: soon again
	path := t.d.objectPath(t.c.Key, t.c.Mode)
	if wd, err := unix.InotifyAddWatch(t.notify.fd, path, unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF); err == nil {
		if !slices.Contains(t.watches, wd) {
			t.watches = append(t.watches, wd)
		}
		t.until = waitCap
	}
	if t.c.Mode == backend.Write {
		t.until = min(t.until, t.c.TTL/4) // its record is renewed in time
	}
}

// free returns the ticket's notifier to the pool.
func (t *ticket) free() {
	if t.notify == nil {
		return
	}
	for _, wd := range t.watches {
		unix.InotifyRmWatch(t.notify.fd, uint32(wd))
	}
	t.d.notifiers.put(t.notify)
	t.notify, t.watches = nil, nil
}

// Leave implements backend.Ticket, through a Close too. A grant reaches
// a lock's ticket only as Wait's answer: there is none to free; an
// object's, and a waiting writer's record, go as at a release.
func (t *ticket) Leave(ctx context.Context) error {
	if t.w != nil {
		t.d.leaveQueue(ctx, t.c.Key, t.w)
	}
	t.free()
	if t.c.Mode != backend.Exclusive {
		_ = t.d.lockedObject(ctx, t.c, false, t.d.dropHold(t.c))
	}
	return nil
}

// The store tries, registered for internal/bench out of the driver's API,
// are the looks at a lock under its flock that its tickets made, each of
// which could take it: Enqueue's, and after a wake-up, a waitCap, a
// holder's expiry or a failed look.
func init() { measure.RegisterStoreTries(func(d *Driver) uint64 { return d.tries.Load() }) }

// turn looks at the lock once, under its flock: it takes it if it is free
// and the ticket's turn, or else queues the ticket (once) and returns
// ErrNotAcquired, and sets until: when to look again at the latest.
func (t *ticket) turn(ctx context.Context) (backend.Grant, error) {
	d, c := t.d, t.c
	var g backend.Grant
	var wake *os.File
	t.until = waitCap
	err := d.locked(ctx, c.Key, true, func(r *record, now int64) (change, error) {
		if t.w != nil && !queued(r, t.w.ticket) {
			// Passed over (it was slow to take its turn), or its queue
			// was reset by a Break: it queues again, at the back.
			d.dropWaiter(t.w)
			t.w = nil
		}
		if !d.live(r, now) {
			n, ok, f := d.next(c.Key, r, now)
			wake = f
			if !ok || (t.w != nil && n == t.w.ticket) {
				if ok {
					r.qhead, r.resvExp = n+1, 0
					d.dropWaiter(t.w)
					t.w = nil
				}
				return d.take(ctx, c, r, now, &g)
			}
			if r.resvExp != 0 {
				t.until = min(t.until, time.Duration(r.resvExp-now))
			}
		} else {
			if r.token == hashToken(c.Token) {
				// A retry by the holder, as TryAcquire's.
				return d.take(ctx, c, r, now, &g)
			}
			t.until = min(t.until, time.Duration(r.expires-now))
		}
		if t.w == nil {
			if err := t.join(r); err != nil {
				return write, err
			}
		}
		return write, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
	})
	wake.Close() // see next
	t.until = max(t.until, time.Millisecond)
	return g, err
}

// join gives the ticket the queue's next number, with its file made and
// flocked and its wake-up watched before the number is written. The
// caller holds the key's flock.
func (t *ticket) join(r *record) error {
	if t.notify == nil {
		nt, err := t.d.notifiers.get()
		if err != nil {
			return err
		}
		t.notify = nt
	}
	for range 64 {
		n := r.qtail
		r.qtail++
		path := t.d.waiterPath(t.c.Key, n)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("filelock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			// A waiter passed over, still alive, has this number's file.
			f.Close()
			continue
		}
		if _, err := unix.InotifyAddWatch(t.notify.fd, path, unix.IN_CLOSE_WRITE); err != nil {
			os.Remove(path)
			f.Close()
			return fmt.Errorf("filelock: inotify: %w", err)
		}
		t.w = &waiter{ticket: n, path: path, file: f}
		return nil
	}
	return fmt.Errorf("filelock: no free ticket for %s", t.d.Path(t.c.Key))
}

// dropWaiter removes w's file and closes it. The caller holds the key's
// flock, so nobody is testing the file meanwhile.
func (d *Driver) dropWaiter(w *waiter) {
	if w == nil || w.dropped {
		return
	}
	w.dropped = true
	// While w holds the file's flock, nobody else can have its name.
	os.Remove(w.path)
	w.file.Close() // the last reference: the watch goes with the file
}

// leaveQueue withdraws w from the queue after a failed or cancelled wait,
// and hands a lock kept for it to the next waiter. It runs through a
// Close too; what it cannot do, the others do: w's file, no longer
// flocked, counts as a dead waiter's.
func (d *Driver) leaveQueue(ctx context.Context, key string, w *waiter) {
	var wake *os.File
	err := d.locked(ctx, key, false, func(r *record, now int64) (change, error) {
		d.dropWaiter(w)
		if !queued(r, w.ticket) {
			return keep, nil
		}
		// Its ticket goes if at either end; one in the middle is passed
		// over (no file) when its turn comes.
		switch w.ticket {
		case r.qtail - 1:
			r.qtail--
			if r.qhead == r.qtail {
				r.resvExp = 0
			}
		case r.qhead:
			r.qhead++
			r.resvExp = 0
		}
		if d.live(r, now) {
			return write, nil
		}
		_, ok, f := d.next(key, r, now)
		wake = f
		if !ok && r.expires == 0 {
			return remove, nil // free, nobody queued: the name leaves nothing
		}
		return write, nil
	})
	wake.Close() // see next
	if err != nil {
		d.dropWaiter(w) // the others pass over its ticket
	}
}

// sleep waits until an event comes on the inotify instance, d passes, or
// ctx ends; it consumes the events, and says whether any came.
func (nt *notifier) sleep(ctx context.Context, d time.Duration) (bool, error) {
	f := nt.f
	// The deadline first: ctx's end moves it to the past, even at once.
	if err := f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, fmt.Errorf("filelock: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var buf [4 * (unix.SizeofInotifyEvent + unix.NAME_MAX + 1)]byte
	n, err := f.Read(buf[:])
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, fmt.Errorf("filelock: inotify: %w", err)
	}
	return n > 0, nil
}

// yield lets other threads, the flock's holder among them, run.
func yield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
