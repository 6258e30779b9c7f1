package backend

import (
	"context"
	"time"
)

// State is what a store knows about one key now, for operators: the
// answer of an Inspector, a Lister or a Breaker. Held is always known;
// every other field means something only when Known has its bit, because
// stores differ in what they record (memcached keeps no queue, a
// ZooKeeper node has no expiry of its own). A driver never guesses a
// field it cannot read: it leaves the bit clear.
type State struct {
	// Key is the key as the driver was given it (see [Key]).
	Key string
	// Held: a holder has the key and, where locks expire, its TTL has not
	// run out.
	Held bool
	// Owner is the holder's Claim.Owner, its label ("" when it gave
	// none). [KnowsOwner].
	Owner string
	// Fence is the holder's fencing token, as its Grant reported it.
	// [KnowsFence].
	Fence uint64
	// TTL is how long the lock lives from now without a refresh or, for
	// a Session driver, without its session's next contact, by the store's
	// clock. [KnowsTTL].
	TTL time.Duration
	// Waiters counts acquisitions queued in the store behind the holder.
	// Only stores with a queue know it: elsewhere waiters poll or listen
	// and leave no trace. [KnowsWaiters].
	Waiters int
	// Queue lists the queued waiters' labels (Claim.Owner), next first
	// ("" for one that gave none). [KnowsQueue].
	Queue []string
	// Known says which fields the store reported.
	Known Fields
}

// Fields is a set of State fields.
type Fields uint8

// The State fields a store may report.
const (
	KnowsOwner Fields = 1 << iota
	KnowsFence
	KnowsTTL
	KnowsWaiters
	KnowsQueue
)

// Has reports whether every field of f is in s.
func (s Fields) Has(f Fields) bool { return s&f == f }

// Inspector is implemented by drivers that can read the state of a key
// without changing it. A key that is free (never locked, released,
// expired) gives State{Key: key} with Held false; when the store keeps a
// queue, Waiters (and Queue) may still be set.
type Inspector interface {
	Inspect(ctx context.Context, key string) (State, error)
}

// Lister is implemented by drivers whose store can enumerate its locks.
type Lister interface {
	// List returns the state of every held key that starts with prefix,
	// sorted by key. It reads the store in pages, but returns all it found.
	List(ctx context.Context, prefix string) ([]State, error)
}

// Breaker is implemented by drivers that can remove a holder that is not
// theirs: the operator's break-glass for a lock whose holder is stuck.
type Breaker interface {
	// Break frees key if, and only if, its holder's fence is fence, and
	// returns that holder's state as it was. It returns ErrNotHeld when
	// the key is free or held under another fence, and then changes
	// nothing. After it, the next grant of key has a fence above fence,
	// and the removed holder's next Refresh (or, for a Session driver, its
	// OnLost) reports the loss: the removal never leaves two holders that
	// both look legitimate.
	Break(ctx context.Context, key string, fence uint64) (State, error)
}
