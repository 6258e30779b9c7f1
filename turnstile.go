package locker

import "github.com/lockerhq/locker/backend"

// A turnstile orders this Client's waiters on one object: only the first
// talks to the store, and it hands the turn to the next when it leaves.
// So a release wakes one waiter per Client, not all of them, and a
// holder that releases and comes back waits behind the waiters it
// released to. Who gets the lock is still the store's decision alone:
// the turnstile only decides who asks.
type turnstile struct {
	waiters []*turn
	// held: the waiter served last holds the object (alone) and has not
	// begun to release it, so the next one's first try would fail.
	held  bool
	freed chan struct{} // closed at this Client's next release of the object
}

// A turn is one waiter's place; ready is nil for the first arrival and
// is closed when the turn reaches the others.
type turn struct{ ready chan struct{} }

// object is what one turnstile orders: a key's lock, semaphore or
// read-write lock (its readers and writers together).
type object struct {
	key  string
	kind backend.Mode // Exclusive, Permit or Read
}

func objectOf(key string, m backend.Mode) object {
	if m == backend.Write {
		m = backend.Read
	}
	return object{key, m}
}

// join queues a waiter on obj.
func (c *Client) join(obj object) (*turnstile, *turn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.turns[obj]
	if ts == nil {
		ts = &turnstile{}
		c.turns[obj] = ts
	}
	t := &turn{}
	if len(ts.waiters) > 0 {
		t.ready = make(chan struct{})
	}
	ts.waiters = append(ts.waiters, t)
	c.waiting.Add(1)
	return ts, t
}

// leave takes t out of ts; won says it took the object in mode m. If t
// was first, the next waiter's turn comes.
func (c *Client) leave(obj object, ts *turnstile, t *turn, won bool, m backend.Mode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(ts.waiters) && ts.waiters[i] != t {
		i++
	}
	ts.waiters = append(ts.waiters[:i], ts.waiters[i+1:]...)
	c.waiting.Add(-1)
	switch {
	case len(ts.waiters) == 0:
		delete(c.turns, obj)
	case i == 0:
		ts.held = won && (m == backend.Exclusive || m == backend.Write)
		close(ts.waiters[0].ready)
	}
}

// freed returns a channel closed at this Client's next release of obj,
// for the first waiter. On a backend that notifies releases, every waiter,
// here or elsewhere, hears of them the same way, so local waiters get no
// head start: the channel is nil.
func (c *Client) freed(obj object, ts *turnstile) <-chan struct{} {
	if c.notifier != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts.freed == nil {
		ts.freed = make(chan struct{})
	}
	return ts.freed
}

// heldHere reports whether the waiter served last on ts still holds it.
func (c *Client) heldHere(ts *turnstile) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ts.held
}

// releasing notes that a holder here begins to release obj; released,
// that the store freed it.
func (c *Client) releasing(obj object) {
	if c.waiting.Load() == 0 {
		return // no turnstile to tell
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts := c.turns[obj]; ts != nil {
		ts.held = false
	}
}

func (c *Client) released(obj object) {
	if c.notifier != nil || c.waiting.Load() == 0 {
		// No waiter here to wake: where the store notifies releases,
		// freed gave none a channel (see freed); with nobody waiting, a
		// waiter that joins now tries after this release.
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts := c.turns[obj]; ts != nil && ts.freed != nil {
		close(ts.freed)
		ts.freed = nil
	}
}
