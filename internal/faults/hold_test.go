package faults

import (
	"context"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/history"
)

// held is a lock a client holds, with its history record and a watcher
// that records the lost signal the moment it fires.
type held struct {
	cl   *client
	l    *locker.Lock
	h    *history.Holder
	stop chan struct{}

	mu     sync.Mutex
	lostAt time.Time
	lost   chan struct{} // closed once lostAt is set
}

// acquire records an attempt by cl on name: Acquire (wait) or TryAcquire.
func (cl *client) acquire(ctx context.Context, name, who string, wait bool) (*held, error) {
	h := cl.e.rec.Begin(name, cl.id+who, cl.e.spec.ttl)
	var l *locker.Lock
	var err error
	// Goroutines the call starts belong to the client, for its leak check.
	pprof.Do(ctx, pprof.Labels("faultclient", cl.id), func(ctx context.Context) {
		if wait {
			l, err = cl.c.Acquire(ctx, name)
		} else {
			l, err = cl.c.TryAcquire(ctx, name)
		}
	})
	if err != nil {
		h.Failed(err)
		return nil, err
	}
	h.Acquired(l.Fence())
	hd := &held{cl: cl, l: l, h: h, stop: make(chan struct{}), lost: make(chan struct{})}
	go hd.watch()
	return hd, nil
}

func (hd *held) watch() {
	// Not the client's goroutine: keep it out of the client's leak check.
	pprof.SetGoroutineLabels(context.Background())
	select {
	case <-hd.l.Lost():
		t := time.Now()
		hd.h.LostAt(hd.toldAt(t))
		hd.mu.Lock()
		hd.lostAt = t
		hd.mu.Unlock()
		close(hd.lost)
	case <-hd.stop:
	}
}

// toldAt is when the holder was told of the loss that this goroutine saw
// at seen, for the history. A lock that lives for its TTL is lost, for its
// holder, from its Deadline on: Err says so then, whatever delays the
// watchdog's timer that closes Lost, and this goroutine, on a loaded
// machine (the library's guarantee: see hold.err); seen is later by those
// delays, and would make an overlap of a correct hand-over. A
// session-backed lock's Err waits for the watchdog: seen it is.
func (hd *held) toldAt(seen time.Time) time.Time {
	if _, session := backend.As[backend.Session](hd.cl.c.Driver()); session {
		return seen
	}
	if d := hd.l.Deadline(); !d.IsZero() && d.Before(seen) {
		return d
	}
	return seen
}

// lostTime is when the lost signal fired, or zero.
func (hd *held) lostTime() time.Time {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	return hd.lostAt
}

// waitLost waits up to d for the lost signal and returns when it fired.
func (hd *held) waitLost(d time.Duration) (time.Time, bool) {
	select {
	case <-hd.lost:
		return hd.lostTime(), true
	case <-time.After(d):
		return time.Time{}, false
	}
}

// release records the release and stops the watcher.
func (hd *held) release(ctx context.Context) error {
	hd.h.ReleaseStart()
	err := hd.l.Release(ctx)
	hd.h.Released(err)
	close(hd.stop)
	return err
}
