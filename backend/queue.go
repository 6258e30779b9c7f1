package backend

import (
	"context"
	"errors"
)

// Queuer is implemented by drivers whose store can wait for a key's turn
// itself: most keep the waiters in order (a ZooKeeper sequential node, an
// etcd key's create revision, a Redis list), so that they are served in
// arrival order and a release wakes only the next; a store may instead
// wake its waiters on its own change notice (file's semaphores and
// read-write locks, woken by inotify), unordered. The driver offers the
// store's steps; the locker package drives them and decides the rest
// (retries, the failure budget, backoff, cancellation, counting). Claims
// in modes outside QueueModes are waited for as for any other driver.
type Queuer interface {
	// QueueModes are the modes whose claims queue. An ordered queue
	// serves weighted permits (Claim.Weight) in arrival order too: an
	// entry enters when the weights held plus those of the entries ahead
	// and its own are at most the limit, so lighter claims behind a heavy
	// one never overtake it.
	QueueModes() ModeSet

	// Enqueue puts c at the back of c.Key's queue. Whenever c may go
	// ahead at once (the key is free, or a permit or a read is open to it
	// past the entries ahead), it takes c.Key and returns its Grant and a
	// nil Ticket. An error with a nil Ticket leaves nothing behind that
	// could keep the key held or others waiting; an error with a Ticket
	// says the entry was made but the look after it failed, and is treated
	// as that Ticket's Wait's error.
	Enqueue(ctx context.Context, c Claim) (Grant, Ticket, error)
}

// A Ticket is one claim's entry in its key's queue.
type Ticket interface {
	// Wait blocks until the entry may have reached its turn (the store's
	// wake-up: a watch on the entry ahead, a release notification), or ctx
	// is done, then looks. It returns the Grant when the claim holds the
	// key; ErrNotAcquired (possibly wrapped) when it looked and the turn
	// has not come (the locker package calls it again at once: each call
	// is one look, and blocks first); ErrRequeue (possibly wrapped) when
	// the store answers that the entry is gone, with its session, or was
	// never made (the locker package enqueues again at once). Any other
	// error means that Wait could not reach the store: the entry stays,
	// and the locker package calls Wait again after a backoff, or Leave
	// once its failure budget is spent. Wait must not
	// block on a dead connection: it returns an error within its store's
	// own detection time. A Grant whose lock lives for TTL from the request
	// that took it sets Grant.Sent.
	Wait(ctx context.Context) (Grant, error)

	// Leave removes the entry, and frees the key if the entry's claim
	// holds it (a grant that came as its caller gave up). The locker
	// package calls it, with a context of its own, whenever it stops
	// waiting without the lock; Leave after ErrRequeue is not called.
	Leave(ctx context.Context) error
}

// ErrRequeue is a Ticket's report that its entry is gone.
var ErrRequeue = errors.New("queue entry gone")
