package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// Backoff of a waiter between tries: a release notification ends a wait
// at once, so these only bound how late an expiry (which notifies
// nobody) or a lost notification is seen.
const (
	waitMin = 2 * time.Millisecond
	waitMax = 250 * time.Millisecond
)

// Acquire implements backend.Waiter. A lock's waiters in this process
// queue in arrival order, and only the first of them tries the store,
// woken by release notifications: a release wakes one waiter per process,
// not all, and a releaser that comes back waits behind the others. An
// arrival with nobody of this process waiting tries at once. Processes
// are not ordered among themselves: their first waiters race at each
// release. Safety is the table's alone (every grant is TryAcquire's
// statement); the queue only decides who tries. Semaphores and
// read-write locks are waited for as the locker package does for a
// Notifier: every waiter tries at each notification.
func (d *Driver) Acquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if c.Mode != backend.Exclusive {
		return d.waitShared(ctx, c)
	}
	us, err := micros(c.TTL)
	if err != nil {
		return backend.Grant{}, err
	}
	ctx, leave, err := d.enter(ctx, "acquire")
	if err != nil {
		return backend.Grant{}, err
	}
	defer leave()
	q, e := d.queues.join(c.Key)
	won := false
	defer func() { d.queues.leave(q, e, won) }()
	if e.first {
		// Nobody here waits: the uncontended path, one statement.
		sent := time.Now()
		d.tries.Add(1)
		g, err := d.tryExclusive(ctx, c, us)
		if err == nil {
			won = true
			g.Sent = sent
			return g, nil
		}
		if !errors.Is(err, backend.ErrNotAcquired) && (ctx.Err() != nil || backend.Permanent(err)) {
			return backend.Grant{}, err
		}
	} else {
		select {
		case <-e.turn:
		case <-ctx.Done():
			return backend.Grant{}, d.ended(ctx)
		}
	}
	// First in this process's queue: wait for the store.
	g, err := d.waitTurn(ctx, c, us, q)
	won = err == nil
	return g, err
}

// waitTurn is the first local waiter's loop: subscribe (which makes the
// key present, so that releases notify), then try at each notification,
// and at a backoff timer for expiries.
func (d *Driver) waitTurn(ctx context.Context, c backend.Claim, us int64, q *keyQueue) (backend.Grant, error) {
	var notified <-chan struct{}
	if ch, cancel, err := d.Subscribe(ctx, c.Key); err == nil {
		defer cancel()
		notified = ch
	} else if ctx.Err() != nil {
		return backend.Grant{}, d.ended(ctx)
	}
	// Subscribed: a release from now on notifies us. The lock is held by
	// the waiter just served here unless it began its release, so the
	// first try would fail: wait for its release instead.
	skip := notified != nil && d.queues.heldHere(q)
	return d.tryLoop(ctx, notified, skip, func() (backend.Grant, error) { return d.tryExclusive(ctx, c, us) })
}

// tryLoop calls try until it grants, woken by notified (nil: none) or a
// backoff timer; skip waits before the first try. It rides out failures
// to reach the store for backend.StoreFailureBudget.
func (d *Driver) tryLoop(ctx context.Context, notified <-chan struct{}, skip bool, try func() (backend.Grant, error)) (backend.Grant, error) {
	bo := retry.Backoff{Min: waitMin, Max: waitMax}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var failing retry.Failing
	for {
		if !skip {
			sent := time.Now()
			d.tries.Add(1)
			g, err := try()
			switch {
			case err == nil:
				// tryLoop runs after a refused try or a turn in the
				// local queue: the lock was waited for.
				g.Sent, g.Waited = sent, true
				return g, nil
			case errors.Is(err, backend.ErrNotAcquired):
				failing.Ok()
			case ctx.Err() != nil:
				return backend.Grant{}, d.ended(ctx)
			case backend.Permanent(err) || failing.Fail(sent, retry.Budget):
				return backend.Grant{}, err
			}
		}
		skip = false
		timer.Reset(bo.Next())
		select {
		case <-ctx.Done():
			return backend.Grant{}, d.ended(ctx)
		case <-notified:
		case <-timer.C:
		}
	}
}

// ended is the error of a wait whose context ended.
func (d *Driver) ended(ctx context.Context) error {
	if d.gate.Closed() {
		return fmt.Errorf("pglock: acquire: %w", backend.ErrClosed)
	}
	return fmt.Errorf("pglock: %w: %w", backend.ErrNotAcquired, context.Cause(ctx))
}

// waitShared waits for a permit, a reader or a writer: every waiter tries
// at each notification. A writer that gives up withdraws its record of
// waiting (backend.Modal), as the locker package does for drivers that
// are not Waiters.
func (d *Driver) waitShared(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if _, _, _, err := d.sharedKinds(c); err != nil {
		return backend.Grant{}, err
	}
	if _, err := micros(c.TTL); err != nil {
		return backend.Grant{}, err
	}
	ctx, leave, err := d.enter(ctx, "acquire")
	if err != nil {
		return backend.Grant{}, err
	}
	defer leave()
	g, err := d.waitSharedLoop(ctx, c)
	if err != nil && c.Mode == backend.Write {
		d.withdraw(c)
	}
	return g, err
}

func (d *Driver) waitSharedLoop(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	// A waiting writer records itself, so that readers let it in.
	try := func() (backend.Grant, error) { return d.tryShared(ctx, c, true) }
	sent := time.Now()
	d.tries.Add(1)
	g, err := try()
	switch {
	case err == nil:
		g.Sent = sent
		return g, nil
	case !errors.Is(err, backend.ErrNotAcquired) && (ctx.Err() != nil || backend.Permanent(err)):
		return backend.Grant{}, err
	}
	var notified <-chan struct{}
	if ch, cancel, err := d.Subscribe(ctx, c.Key); err == nil {
		defer cancel()
		notified = ch
	} else if ctx.Err() != nil {
		return backend.Grant{}, d.ended(ctx)
	}
	return d.tryLoop(ctx, notified, false, try)
}

// withdraw removes a writer's record of waiting, within CancelGrace, and
// in the background after that.
func (d *Driver) withdraw(c backend.Claim) {
	done := d.undo(func(ctx context.Context) { _ = d.releaseShared(ctx, c) })
	t := time.NewTimer(backend.CancelGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// queues are the local waiters of each lock key, in arrival order.
type queues struct {
	mu   sync.Mutex
	keys map[string]*keyQueue
}

type keyQueue struct {
	key     string
	waiters []*queued
	// held: the last waiter served here holds the lock and has not begun
	// to release it (Release clears it before its statement).
	held bool
}

type queued struct {
	first bool          // nobody was queued before it
	turn  chan struct{} // closed when it becomes first
}

func (qs *queues) join(key string) (*keyQueue, *queued) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.keys == nil {
		qs.keys = map[string]*keyQueue{}
	}
	q := qs.keys[key]
	if q == nil {
		q = &keyQueue{key: key}
		qs.keys[key] = q
	}
	e := &queued{first: len(q.waiters) == 0, turn: make(chan struct{})}
	q.waiters = append(q.waiters, e)
	return q, e
}

// leave takes e out of q; won says it got the lock. The next waiter, if
// e was first, becomes first.
func (qs *queues) leave(q *keyQueue, e *queued, won bool) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	i := 0
	for i < len(q.waiters) && q.waiters[i] != e {
		i++
	}
	if i == len(q.waiters) {
		return
	}
	q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
	if len(q.waiters) == 0 {
		delete(qs.keys, q.key)
		return
	}
	if i == 0 {
		q.held = won
		close(q.waiters[0].turn)
	}
}

// heldHere reports whether the waiter served last in q still holds the
// lock, not yet releasing it.
func (qs *queues) heldHere(q *keyQueue) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return q.held
}

// releasing notes that key's holder here begins to release it.
func (qs *queues) releasing(key string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.keys[key]; q != nil {
		q.held = false
	}
}
