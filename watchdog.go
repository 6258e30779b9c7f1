package locker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
)

const (
	// maxRefreshing bounds the refresh calls one Client has in flight.
	maxRefreshing = 64
	// maxBatch bounds the locks in one RefreshMany call.
	maxBatch = 512
)

// early is how much sooner than due a hold may be refreshed, so that holds
// due at nearly the same time share a batch: a twelfth of the TTL, a
// quarter of the time between refreshes. A deadline has no early window.
// The watchdog wakes when the first hold is due, and takes along every
// hold whose early window has begun: holds that fall due one after the
// other (acquired in a stream) share a batch, instead of each waking the
// watchdog as its own window opens.
func early(h *hold) time.Duration {
	if h.atDeadline {
		return 0
	}
	return h.ttl / 12
}

// watchdog keeps a Client's locks alive and owns their deadlines: one
// goroutine and one timer per Client, not per lock, with the holds in a
// heap by when they are next due. An automatically refreshed hold is due
// for a refresh every TTL/3; while that refresh is in flight, and always
// for a hold without automatic refresh or kept by a session, it is due at
// its deadline, when it is declared lost unless a confirmation moved the
// deadline on. So the lost signal fires on the Client's clock, whatever
// the store or its client library is doing.
type watchdog struct {
	c     *Client
	batch backend.BatchRefresher // nil unless the driver refreshes in batches
	mu    sync.Mutex
	due   holdHeap
	armed time.Time // when the timer fires next; guarded by mu
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	sem   chan struct{}
	busy  sync.WaitGroup
}

func newWatchdog(c *Client) *watchdog {
	w := &watchdog{
		c:    c,
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
		sem:  make(chan struct{}, maxRefreshing),
	}
	w.batch, _ = backend.As[backend.BatchRefresher](c.drv)
	go w.run()
	return w
}

// schedule (re)places h after a confirmation sent at start.
func (w *watchdog) schedule(h *hold, start time.Time) {
	h.mu.Lock()
	if h.done || h.lostErr != nil {
		h.mu.Unlock()
		return
	}
	until := h.validUntil
	h.mu.Unlock()
	switch {
	case h.contact != nil:
		w.put(h, until, true)
	case w.c.session != nil:
		// A session driver that reports no contact keeps the lock alive
		// and reports losses itself.
	case h.auto:
		w.put(h, start.Add(h.ttl/3), false)
	default:
		w.put(h, until, true)
	}
}

// put schedules h at at: its deadline, or the time of its next refresh.
func (w *watchdog) put(h *hold, at time.Time, deadline bool) {
	w.mu.Lock()
	h.due, h.atDeadline = at, deadline
	if h.slot >= 0 {
		heap.Fix(&w.due, h.slot)
	} else {
		heap.Push(&w.due, h)
	}
	// Wake the goroutine only if h must fire before its timer does.
	sooner := w.due[0] == h && at.Before(w.armed)
	w.mu.Unlock()
	if sooner {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (w *watchdog) unschedule(h *hold) {
	w.mu.Lock()
	if h.slot >= 0 {
		heap.Remove(&w.due, h.slot)
	}
	w.mu.Unlock()
}

// stop ends the watchdog's goroutine; refreshes in flight end as the
// Client's context does, or when the driver closes (Close waits for them).
func (w *watchdog) stop() {
	close(w.quit)
	<-w.done
}

func (w *watchdog) run() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var ready []due
		w.mu.Lock()
		// The holds that are due, and with them those in their early
		// window.
		for len(w.due) > 0 && (!w.due[0].due.After(now) || len(ready) > 0 && w.due[0].due.Sub(now) <= early(w.due[0])) {
			h := heap.Pop(&w.due).(*hold)
			ready = append(ready, due{h, h.atDeadline})
		}
		next := time.Hour
		if len(w.due) > 0 {
			next = w.due[0].due.Sub(now)
		}
		w.armed = now.Add(next)
		w.mu.Unlock()
		w.fire(ready, now)
		timer.Reset(next)
		select {
		case <-w.quit:
			return
		case <-w.wake:
		case <-timer.C:
		}
	}
}

// due is a hold that fell due, and whether at its deadline.
type due struct {
	h        *hold
	deadline bool
}

// fire handles the holds that fell due: lost if their deadline passed,
// else refreshed in the background, in batches where the driver can, and
// meanwhile due again at their deadline. It never waits for the store.
func (w *watchdog) fire(ready []due, now time.Time) {
	var refresh []*hold
	for _, d := range ready {
		h := d.h
		h.mu.Lock()
		skip := h.done || h.lostErr != nil
		until, lastErr := h.validUntil, h.refreshErr
		send := !skip && h.contact == nil && now.Before(until) && h.auto && !d.deadline
		if send {
			// Marked under the lock that release sets done with: a
			// release either sees this refresh or prevents it.
			h.renewing = make(chan struct{})
		}
		h.mu.Unlock()
		if skip {
			continue
		}
		if h.contact != nil {
			w.checkSession(h, now)
			continue
		}
		switch {
		case !now.Before(until):
			h.loseBy(LostExpired, h.ranOut(lastErr))
		case !send:
			// Nothing to send: no automatic refresh, or one is in flight
			// and will reschedule h when it ends.
			w.put(h, until, true)
		default:
			w.put(h, until, true)
			refresh = append(refresh, h)
		}
	}
	for len(refresh) > 0 {
		n := 1
		if w.batch != nil {
			n = min(len(refresh), maxBatch)
		}
		group := refresh[:n]
		refresh = refresh[n:]
		select {
		case w.sem <- struct{}{}:
		default:
			// Too many refreshes in flight (a slow store): try these
			// again shortly, or else at their deadlines.
			for _, h := range append(group, refresh...) {
				h.renewed()
				w.retry(h, now.Add(max(h.ttl/20, time.Millisecond)))
			}
			return
		}
		w.busy.Add(1)
		go func() {
			defer func() { <-w.sem; w.busy.Done() }()
			w.refresh(group)
			for _, h := range group {
				h.renewed()
			}
		}()
	}
}

// checkSession declares a session-backed hold lost once its session may
// have expired, and otherwise looks again at the new deadline.
func (w *watchdog) checkSession(h *hold, now time.Time) {
	until, gone := h.sessionGone(now)
	if gone {
		return
	}
	h.mu.Lock()
	if until.After(h.validUntil) {
		h.validUntil = until
	}
	h.mu.Unlock()
	w.put(h, until, true)
}

// refresh refreshes hs, in one call when there are several, each bounded by
// the earliest deadline among them.
func (w *watchdog) refresh(hs []*hold) {
	until := hs[0].deadline()
	locks := make([]backend.Claim, len(hs))
	for i, h := range hs {
		locks[i] = h.lock()
		if d := h.deadline(); d.Before(until) {
			until = d
		}
	}
	ctx, cancel := context.WithDeadline(w.c.gate.Context(), until)
	defer cancel()
	start := time.Now()
	var errs []error
	if len(hs) == 1 {
		errs = []error{w.c.drv.Refresh(ctx, locks[0])}
	} else {
		errs = w.batch.RefreshMany(ctx, locks)
	}
	for i, h := range hs {
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = fmt.Errorf("locker: driver returned %d results for %d refreshes", len(errs), len(hs))
		}
		w.settle(h, start, err)
	}
}

// settle records the outcome of h's refresh that was sent at start.
func (w *watchdog) settle(h *hold, start time.Time, err error) {
	w.c.refreshed(h, true, start, err)
	switch {
	case err == nil:
		h.mu.Lock()
		h.refreshErr = nil
		h.mu.Unlock()
		h.confirmed(start)
	case errors.Is(err, ErrNotHeld):
		h.loseBy(LostGone, fmt.Errorf("locker: %q: %w: refresh found it gone", h.name, ErrLost))
	case w.c.gate.Closed():
		// Closing.
	default:
		// Could not tell: retry soon; the deadline stays as it was.
		w.c.cfg.logger.Warn("locker: refresh failed, retrying", "name", h.name, "token", Token(h.token), "err", err)
		h.mu.Lock()
		h.refreshErr = err
		h.mu.Unlock()
		w.retry(h, time.Now().Add(max(h.ttl/10, 10*time.Millisecond)))
	}
}

// retry schedules h's next refresh at at, or its deadline if that comes
// first: h has one place in the heap, and its loss must not wait for a
// try after its deadline.
func (w *watchdog) retry(h *hold, at time.Time) {
	h.mu.Lock()
	until := h.validUntil
	h.mu.Unlock()
	if !at.Before(until) {
		w.put(h, until, true)
		return
	}
	w.put(h, at, false)
}

// holdHeap orders holds by due time.
type holdHeap []*hold

func (q holdHeap) Len() int           { return len(q) }
func (q holdHeap) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q holdHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].slot, q[j].slot = i, j
}
func (q *holdHeap) Push(x any) {
	h := x.(*hold)
	h.slot = len(*q)
	*q = append(*q, h)
}
func (q *holdHeap) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.slot = -1
	*q = old[:len(old)-1]
	return h
}
