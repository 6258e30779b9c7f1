package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// waitCap bounds a queued waiter's sleep without a wake-up: it then looks
// at the lock itself, for a woken waiter that died or stalled before
// taking it (the others are not told), or an expired holder.
const waitCap = 250 * time.Millisecond

// waiter is one lockTicket's place in the queue: its ticket, its
// flocked file, and the inotify instance that hears its wake-up.
type waiter struct {
	ticket  uint64
	path    string
	file    *os.File // flocked while queued
	notify  *notifier
	dropped bool
}

// A notifier is an inotify instance, non-blocking, so that reads honour
// deadlines. Closing one waits for the kernel to retire its watches
// (milliseconds), so a driver keeps those it made for its next waiters:
// notifierPool, closed by Close. A watch goes with its file: a waiter's
// file is removed before its notifier returns to the pool.
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

// QueueModes implements backend.Queuer. A lock's waiters queue in its
// file (queue.go); a semaphore's or a read-write lock's have no order:
// their ticket is a watch on the object's file (watchTicket).
func (d *Driver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Enqueue implements backend.Queuer: the lock is taken at once when it is
// free and nobody is queued; otherwise the caller queues, and its ticket
// sleeps until its turn comes (woken by the kernel), the holder's TTL
// runs out, or waitCap passes. Killed, a waiter's place is passed over.
func (d *Driver) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	if c.Mode != backend.Exclusive {
		return d.enqueueShared(ctx, c)
	}
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, nil, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	t := &lockTicket{d: d, c: c}
	g, err := t.look(ctx)
	switch {
	case err == nil:
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, t, nil
	case t.w != nil:
		// The ticket's file was made, and the record's write failed.
		return backend.Grant{}, t, err
	}
	return backend.Grant{}, nil, err
}

// lockTicket is a lock's waiter: its place in the lock file's queue.
type lockTicket struct {
	d     *Driver
	c     backend.Claim
	w     *waiter       // nil once dropped (a grant, or a failed look)
	until time.Duration // the longest sleep before the next look
}

// Wait implements backend.Ticket.
func (t *lockTicket) Wait(ctx context.Context) (backend.Grant, error) {
	ctx, leave, err := t.d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	if t.w != nil {
		ok, err := t.w.notify.sleep(ctx, t.until)
		if err != nil {
			return backend.Grant{}, err
		}
		if ok {
			t.d.woken.Add(1)
		}
	}
	return t.look(ctx)
}

// look looks at the lock once (turn), and dates a grant.
func (t *lockTicket) look(ctx context.Context) (backend.Grant, error) {
	sent := time.Now()
	t.d.tries.Add(1)
	g, until, err := t.d.turn(ctx, t.c, &t.w)
	g.Sent, t.until = sent, until
	if err != nil && !errors.Is(err, backend.ErrNotAcquired) {
		t.until = 0 // the locker package backed off: look at once
	}
	return g, err
}

// Leave implements backend.Ticket. A grant reaches the ticket only as
// Wait's answer: there is none to free.
func (t *lockTicket) Leave(ctx context.Context) error {
	if t.w != nil {
		t.d.leaveQueue(ctx, t.c.Key, t.w)
	}
	return nil
}

// Registered for internal/bench, out of the driver's API.
func init() { measure.RegisterStoreTries((*Driver).storeTries) }

// storeTries is the looks at a lock under its flock that its queue's
// Enqueue and Wait made, each of which could take it: the first, and
// after a wake-up, a waitCap, a holder's expiry or a failed look.
func (d *Driver) storeTries() uint64 { return d.tries.Load() }

// turn looks at the lock once, under its flock: it takes it if it is free
// and this caller's turn, or else queues the caller (once) and returns
// ErrNotAcquired and when to look again at the latest.
func (d *Driver) turn(ctx context.Context, c backend.Claim, wp **waiter) (backend.Grant, time.Duration, error) {
	var g backend.Grant
	var wake *os.File
	until := waitCap
	err := d.locked(ctx, c.Key, true, func(r *record, now int64) (change, error) {
		w := *wp
		if w != nil && !queued(r, w.ticket) {
			// Passed over (it was slow to take its turn), or its queue
			// was reset by a Break: it queues again, at the back.
			d.dropWaiter(w)
			*wp, w = nil, nil
		}
		if !d.live(r, now) {
			t, ok, f := d.next(c.Key, r, now)
			wake = f
			if !ok || (w != nil && t == w.ticket) {
				if ok {
					r.qhead, r.resvExp = t+1, 0
					d.dropWaiter(w)
					*wp = nil
				}
				return d.take(ctx, c, r, now, &g)
			}
			if r.resvExp != 0 {
				until = min(until, time.Duration(r.resvExp-now))
			}
		} else {
			if r.token == hashToken(c.Token) {
				// A retry by the holder, as TryAcquire's.
				return d.take(ctx, c, r, now, &g)
			}
			until = min(until, time.Duration(r.expires-now))
		}
		if w == nil {
			nw, err := d.joinQueue(c.Key, r)
			if err != nil {
				return write, err
			}
			*wp = nw
		}
		return write, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
	})
	closeWake(wake)
	return g, max(until, time.Millisecond), err
}

// joinQueue gives the caller the next ticket, with its file made and
// flocked and its wake-up watched before the ticket is written. The caller
// holds the key's flock.
func (d *Driver) joinQueue(key string, r *record) (*waiter, error) {
	notify, err := d.notifiers.get()
	if err != nil {
		return nil, err
	}
	for range 64 {
		t := r.qtail
		r.qtail++
		path := d.waiterPath(key, t)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			d.notifiers.put(notify)
			return nil, fmt.Errorf("filelock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			// A waiter passed over, still alive, has this ticket's file.
			f.Close()
			continue
		}
		if _, err := unix.InotifyAddWatch(notify.fd, path, unix.IN_CLOSE_WRITE); err != nil {
			os.Remove(path)
			f.Close()
			d.notifiers.put(notify)
			return nil, fmt.Errorf("filelock: inotify: %w", err)
		}
		return &waiter{ticket: t, path: path, file: f, notify: notify}, nil
	}
	d.notifiers.put(notify)
	return nil, fmt.Errorf("filelock: no free ticket for %s", d.Path(key))
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
	d.notifiers.put(w.notify)
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
	closeWake(wake)
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
