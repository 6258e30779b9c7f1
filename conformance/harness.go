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
	// FIFO claims that blocked waiters are served in arrival order.
	FIFO bool
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
