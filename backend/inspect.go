package backend

import (
	"context"
	"time"
)

// State is what a store knows about one object of a key now, for
// operators: the answer of an Inspector, a Lister or a Breaker. For a
// lock (Exclusive), Owner, Fence and TTL describe its holder; for a
// semaphore (Permit) or a read-write lock (Read), Holders lists its
// grants and Owner, Fence and TTL stay unset. Held is always known;
// every other field means something only when Known has its bit, because
// stores differ in what they record (memcached keeps no queue, a
// ZooKeeper node has no expiry of its own). A driver never guesses a
// field it cannot read: it leaves the bit clear.
type State struct {
	// Key is the key as the driver was given it (see [Key]).
	Key string
	// Mode is the object: Exclusive (the lock), Permit (the semaphore) or
	// Read (the read-write lock, whichever side its holders took).
	Mode Mode
	// Held: a holder has the object and, where locks expire, its TTL has
	// not run out.
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
	// Limit is the semaphore's limit, as its holders' claims carried it.
	// [KnowsLimit].
	Limit int
	// Holders are the unexpired grants of a semaphore or a read-write
	// lock, in any order (the locker package sorts them); each holder's
	// Owner and TTL mean something only with KnowsOwner and KnowsTTL.
	// [KnowsHolders].
	Holders []Holder
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
	KnowsLimit
	KnowsHolders
)

// Holder is one grant of a semaphore or a read-write lock.
type Holder struct {
	// Mode is Permit, Read or Write.
	Mode Mode
	// Owner is the holder's Claim.Owner.
	Owner string
	// Fence is the grant's fencing token, as its Grant reported it.
	Fence uint64
	// TTL is how long the grant lives from now without a refresh (see
	// State.TTL).
	TTL time.Duration
	// Weight is how many permits a Permit grant holds (Claim.Weight);
	// 1 for Read and Write.
	Weight int
}

// Has reports whether every field of f is in s.
func (s Fields) Has(f Fields) bool { return s&f == f }

// For returns s, what a store records of a lock's holder, with what it
// reports besides of the object of mode m: the holders of a semaphore or
// a read-write lock, and a semaphore's limit.
func (s Fields) For(m Mode) Fields {
	switch Object(m) {
	case Exclusive:
		return s
	case Permit:
		return s | KnowsHolders | KnowsLimit
	}
	return s | KnowsHolders
}

// Inspector, Lister and Breaker take the object they see as a Mode:
// Exclusive for the lock, Permit for the semaphore, Read (or Write, the
// same object) for the read-write lock. A driver that cannot see an
// object's grants returns ErrUnsupported for its mode, before any request;
// Modal drivers are expected to see every mode they take.

// Inspector is implemented by drivers that can read the state of a key's
// object without changing it. A free object (never taken, released,
// expired) gives State{Key: key, Mode: m} with Held false (Mode Read for
// Write); when the store keeps a queue, Waiters (and Queue) may still be
// set.
type Inspector interface {
	Inspect(ctx context.Context, key string, m Mode) (State, error)
}

// Lister is implemented by drivers whose store can enumerate its objects.
type Lister interface {
	// List returns the state of every held object of mode m whose key
	// starts with prefix, in any order (the locker package sorts them by
	// key). It reads the store in pages, but returns all it found.
	List(ctx context.Context, prefix string, m Mode) ([]State, error)
}

// Breaker is implemented by drivers that can remove a holder that is not
// theirs: the operator's break-glass for a holder that is stuck.
type Breaker interface {
	// Break frees the grant of key's object m whose fence is fence (the
	// lock's holder, or one permit, reader or writer) and returns the
	// state it had, with Holders holding just that grant for a semaphore
	// or a read-write lock. It returns ErrNotHeld when no grant has that
	// fence, and then changes nothing. After it, the next grant of the
	// object has a fence above fence, the other grants stay, and the
	// removed holder's next Refresh (or, for a Session driver, its
	// OnLost) reports the loss: the removal never leaves two holders
	// that both look legitimate.
	Break(ctx context.Context, key string, m Mode, fence uint64) (State, error)
}

// Object returns the mode that names m's object: Read for Write.
func Object(m Mode) Mode {
	if m == Write {
		return Read
	}
	return m
}
