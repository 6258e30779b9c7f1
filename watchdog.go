package locker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// maxRefreshing bounds the refreshes one Client has in flight.
const maxRefreshing = 64

// watchdog keeps a Client's locks alive: one goroutine and one timer per
// Client, not per lock, with the holds in a heap by when they are next due.
// A hold is due for a refresh every TTL/3, or, without automatic refresh,
// at its deadline, when it is declared lost.
type watchdog struct {
	c    *Client
	mu   sync.Mutex
	due  holdHeap
	wake chan struct{}
	quit chan struct{}
	done chan struct{}
	sem  chan struct{}
	busy sync.WaitGroup
}

func newWatchdog(c *Client) *watchdog {
	w := &watchdog{
		c:    c,
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
		sem:  make(chan struct{}, maxRefreshing),
	}
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
	var at time.Time
	switch {
	case w.c.session != nil:
		h.mu.Unlock()
		return // the driver's session keeps it alive and reports losses
	case h.auto:
		at = start.Add(h.ttl / 3)
	default:
		at = h.validUntil
	}
	h.mu.Unlock()
	w.put(h, at)
}

func (w *watchdog) put(h *hold, at time.Time) {
	w.mu.Lock()
	h.due = at
	if h.slot >= 0 {
		heap.Fix(&w.due, h.slot)
	} else {
		heap.Push(&w.due, h)
	}
	first := w.due[0] == h
	w.mu.Unlock()
	if first {
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

func (w *watchdog) stop() {
	close(w.quit)
	<-w.done
	w.busy.Wait()
}

func (w *watchdog) run() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var ready []*hold
		w.mu.Lock()
		for len(w.due) > 0 && !w.due[0].due.After(now) {
			ready = append(ready, heap.Pop(&w.due).(*hold))
		}
		next := time.Hour
		if len(w.due) > 0 {
			next = w.due[0].due.Sub(now)
		}
		w.mu.Unlock()
		for _, h := range ready {
			if !w.fire(h, now) {
				return
			}
		}
		timer.Reset(next)
		select {
		case <-w.quit:
			return
		case <-w.wake:
		case <-timer.C:
		}
	}
}

// fire handles a due hold: lost if its deadline passed, else refreshed in
// the background. It returns false when the watchdog is stopping.
func (w *watchdog) fire(h *hold, now time.Time) bool {
	h.mu.Lock()
	skip := h.done || h.lostErr != nil
	until, lastErr := h.validUntil, h.refreshErr
	h.mu.Unlock()
	switch {
	case skip:
		return true
	case !now.Before(until):
		why := "its TTL ran out without a refresh"
		if lastErr != nil {
			why = "refreshes failed until its TTL ran out: " + lastErr.Error()
		}
		h.lose(fmt.Errorf("locker: %q: %w: %s", h.name, ErrLost, why))
		return true
	case !h.auto:
		w.put(h, until)
		return true
	}
	select {
	case w.sem <- struct{}{}:
	case <-w.quit:
		return false
	}
	w.busy.Add(1)
	go func() {
		defer func() { <-w.sem; w.busy.Done() }()
		w.refresh(h, until)
	}()
	return true
}

func (w *watchdog) refresh(h *hold, until time.Time) {
	ctx, cancel := context.WithDeadline(w.c.ctx, until)
	defer cancel()
	start := time.Now()
	err := w.c.drv.Refresh(ctx, h.lock())
	switch {
	case err == nil:
		h.mu.Lock()
		h.refreshErr = nil
		h.mu.Unlock()
		h.confirmed(start)
	case errors.Is(err, ErrNotHeld):
		h.lose(fmt.Errorf("locker: %q: %w: refresh found it gone", h.name, ErrLost))
	case w.c.ctx.Err() != nil:
		// Closing.
	default:
		// Could not tell: retry soon, and declare it lost at the deadline.
		w.c.cfg.logger.Warn("locker: refresh failed, retrying", "name", h.name, "token", Token(h.token), "err", err)
		h.mu.Lock()
		h.refreshErr = err
		h.mu.Unlock()
		at := time.Now().Add(max(h.ttl/10, 10*time.Millisecond))
		if at.After(until) {
			at = until
		}
		w.put(h, at)
	}
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
