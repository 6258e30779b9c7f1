package conformance

import (
	"context"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Harness connects the suite to one backend's store.
type Harness interface {
	// NewDriver returns a new driver on the shared store, as independent of
	// the others as a separate process would be: its own connections, its
	// own session. The suite closes it, through locker.Client.Close.
	NewDriver(ctx context.Context) (backend.Driver, error)

	// Expire takes the lock on key away as the store would when its
	// holder's TTL runs out: delete the key, expire the holder's lease or
	// session. The key is exactly the one the driver was given.
	Expire(ctx context.Context, key string) error

	// Traits describes the backend to the suite.
	Traits() Traits
}

// Traits are the facts about a backend that change what the suite expects.
type Traits struct {
	// TTL is the lock TTL the suite uses; zero means 500ms. Use the
	// smallest TTL the backend honours exactly, since several cases wait for
	// a multiple of it.
	TTL time.Duration
	// Granularity is how much later than its TTL the store may free an
	// expired lock (memcached counts whole seconds, and its clock can skip
	// one: 2s). Zero for exact.
	Granularity time.Duration
	// FIFO is the set of modes whose blocked waiters the backend serves
	// in arrival order: FIFOWaiters runs for backend.Exclusive,
	// SemaphoreFIFOWaiters and SemaphoreWeightsFIFO for backend.Permit.
	FIFO backend.ModeSet
	// Retention is how long after a name's last release the store still
	// keeps something of it (a fence counter, a row, a file), as the
	// harness's drivers are configured; zero when a release leaves nothing.
	// ForgetsReleasedNames checks, through a ResidueCounter, that nothing
	// is left after it.
	Retention time.Duration
	// IgnoreGoroutines lists functions (substrings of a goroutine's stack)
	// that the store's client library starts outside the Client under
	// test and leaves running: process-wide helpers, or work of another
	// client of the same test that stays open across the check (a
	// connection pool's dial retries). The leak checks pass over them.
	IgnoreGoroutines []string
}

// WaiterCounter is implemented by harnesses whose backend keeps an entry in
// the store per waiter (a queue node, a waiter key). The suite uses it to
// check that a cancelled or failed acquisition leaves no entry behind.
type WaiterCounter interface {
	// Entries counts the store's entries for key: the holder's and every
	// waiter's.
	Entries(ctx context.Context, key string) (int, error)
}

// Outager is implemented by harnesses that can cut a driver off from the
// store for a while: a TCP proxy on loopback between that driver and a
// networked store. The suite uses it to check that a blocking Acquire
// rides out a short outage and gives up after backend.StoreFailureBudget.
type Outager interface {
	// NewCutDriver returns a new driver, as NewDriver does, and a switch
	// for its connections alone: down(true) resets every connection of
	// the driver and refuses new ones; down(false) lets them through
	// again. Other drivers are unaffected.
	NewCutDriver(ctx context.Context) (drv backend.Driver, down func(bool), err error)
}

// ResidueCounter is implemented by harnesses that can count everything
// the store keeps for a lock name. The suite uses it to check that the
// store forgets a name Traits.Retention after its last release, so that
// locking per entity (per tenant, per order) does not fill the store.
type ResidueCounter interface {
	// Residue counts the store's entries of every kind for key: the lock,
	// its fence counter, queue entries, rows, files, nodes.
	Residue(ctx context.Context, key string) (int, error)
}
