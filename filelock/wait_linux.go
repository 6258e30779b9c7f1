package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/retry"
	"golang.org/x/sys/unix"
)

// On Linux the driver queues waiters (queue.go) and the kernel wakes them:
// backend.Waiter. Elsewhere the locker package polls.
var _ backend.Waiter = (*Driver)(nil)

// queuesWaiters says that the driver is a backend.Waiter.
const queuesWaiters = true

// waitCap bounds a queued waiter's sleep without a wake-up: it then looks
// at the lock itself, for a woken waiter that died or stalled before
// taking it (the others are not told), or an expired holder.
const waitCap = 250 * time.Millisecond

// errWait is a turn's answer when the caller must wait.
var errWait = errors.New("wait")

// waiter is one blocked Acquire's place in the queue: its ticket, its
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

// Acquire implements backend.Waiter: the lock is taken at once when it is
// free and nobody is queued; otherwise the caller queues and sleeps until
// its turn comes (woken by the kernel), the holder's TTL runs out, or ctx
// ends. A waiter leaves its queue place (and its file) whatever way it
// returns; killed, its place is passed over.
func (d *Driver) Acquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if c.Mode != backend.Exclusive {
		return d.pollShared(ctx, c)
	}
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	var w *waiter
	defer func() {
		if w != nil {
			d.leaveQueue(ctx, c.Key, w)
		}
	}()
	b := retry.Backoff{Min: 2 * time.Millisecond, Max: waitCap}
	var failing retry.Failing
	waited := false
	for {
		sent := time.Now()
		d.tries.Add(1)
		g, until, err := d.turn(ctx, c, &w)
		switch {
		case err == nil:
			g.Sent, g.Waited = sent, waited
			return g, nil
		case errors.Is(err, errWait):
			waited = true // queued: it gets its turn after others
			failing.Ok()
			if err := w.sleep(ctx, until, &d.woken); err != nil {
				return backend.Grant{}, err
			}
		case ctx.Err() != nil:
			return backend.Grant{}, ctx.Err()
		case backend.Permanent(err) || failing.Fail(sent, backend.StoreFailureBudget):
			return backend.Grant{}, err
		default:
			if err := retry.Sleep(ctx, b.Next()); err != nil {
				return backend.Grant{}, err
			}
		}
	}
}

// Registered for internal/bench, out of the driver's API.
func init() { measure.RegisterStoreTries((*Driver).storeTries) }

// storeTries is the looks at a lock under its flock that Acquire made,
// its first included, each of which could take it: after a wake-up, a
// waitCap, a holder's expiry or a failed look.
func (d *Driver) storeTries() uint64 { return d.tries.Load() }

// turn looks at the lock once, under its flock: it takes it if it is free
// and this caller's turn, or else queues the caller (once) and returns
// errWait and when to look again at the latest.
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
		return write, errWait
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
// and hands a lock kept for it to the next waiter. It runs bounded by
// CancelGrace, through a Close too; what it cannot do, the others do: w's
// file, no longer flocked, counts as a dead waiter's.
func (d *Driver) leaveQueue(ctx context.Context, key string, w *waiter) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backend.CancelGrace)
	defer cancel()
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

// sleep waits until w is woken, d passes, or ctx ends, and counts
// wake-ups in woken.
func (w *waiter) sleep(ctx context.Context, d time.Duration, woken *atomic.Uint64) error {
	ok, err := w.notify.sleep(ctx, d)
	if ok {
		woken.Add(1)
	}
	return err
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

// pollShared waits for a semaphore permit or a read-write lock, which
// have no queue: it tries again whenever the object's file is written or
// removed (inotify; releases, by any process, write or remove it), and
// at least every waitCap for holders that expired. A waiting writer that
// gives up withdraws its record (backend.Modal).
func (d *Driver) pollShared(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	var notify *notifier
	var watches []int
	defer func() {
		if notify != nil {
			for _, wd := range watches {
				unix.InotifyRmWatch(notify.fd, uint32(wd))
			}
			d.notifiers.put(notify)
		}
	}()
	b := retry.Backoff{Min: 2 * time.Millisecond, Max: waitCap}
	var failing retry.Failing
	path := d.objectPath(c.Key, c.Mode)
	waited := false // a try was refused
	for {
		watched := false
		if notify != nil {
			// Watched before the try, so that no release after it is missed.
			wd, werr := unix.InotifyAddWatch(notify.fd, path, unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF)
			watched = werr == nil
			if watched && !slices.Contains(watches, wd) {
				watches = append(watches, wd)
			}
		}
		sent := time.Now()
		g, err := d.tryShared(ctx, c, true)
		switch {
		case err == nil:
			g.Sent, g.Waited = sent, waited
			return g, nil
		case errors.Is(err, backend.ErrNotAcquired):
			waited = true
			failing.Ok()
		case ctx.Err() != nil:
			return backend.Grant{}, d.withdraw(ctx, c, ctx.Err())
		case backend.Permanent(err) || failing.Fail(sent, backend.StoreFailureBudget):
			return backend.Grant{}, d.withdraw(ctx, c, err)
		}
		if notify == nil && errors.Is(err, backend.ErrNotAcquired) {
			nt, nerr := d.notifiers.get()
			if nerr != nil {
				return backend.Grant{}, d.withdraw(ctx, c, nerr)
			}
			notify = nt
			continue // watch, then try again
		}
		wait := b.Next()
		if watched {
			wait = waitCap
		}
		if c.Mode == backend.Write {
			wait = min(wait, c.TTL/4) // its record is renewed in time
		}
		if notify == nil {
			err = retry.Sleep(ctx, wait)
		} else {
			_, err = notify.sleep(ctx, wait)
		}
		if err != nil {
			return backend.Grant{}, d.withdraw(ctx, c, err)
		}
	}
}

// withdraw removes a waiting writer's record, as a release does, before
// returning err.
func (d *Driver) withdraw(ctx context.Context, c backend.Claim, err error) error {
	if c.Mode == backend.Write {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backend.CancelGrace)
		defer cancel()
		_ = d.releaseObject(wctx, c)
	}
	return err
}
