package backend

import (
	"context"
	"strconv"
)

// Mode is what a Claim asks for on its Key. A key names three separate
// objects, one per kind: a lock (Exclusive), a semaphore (Permit) and a
// read-write lock (Read and Write). A driver keeps their state apart, so
// that a lock, a semaphore and a read-write lock of one name never
// interfere, and each has its own fence counter.
type Mode uint8

// The modes of a Claim.
const (
	// Exclusive is the lock on Key: one holder at a time. Every driver
	// takes it.
	Exclusive Mode = iota
	// Permit is one of Claim.Limit permits of the semaphore Key.
	Permit
	// Read is a reader of the read-write lock Key: shared with other
	// readers, never with a writer.
	Read
	// Write is the writer of the read-write lock Key: alone, with no
	// reader.
	Write
)

func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Permit:
		return "permit"
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// ModeSet is a set of Modes.
type ModeSet uint8

// Modes returns the set of ms.
func Modes(ms ...Mode) ModeSet {
	var s ModeSet
	for _, m := range ms {
		s |= 1 << m
	}
	return s
}

// Has reports whether m is in s.
func (s ModeSet) Has(m Mode) bool { return s&(1<<m) != 0 }

// MaxLimit bounds a semaphore's limit: every driver stores this many
// permits of one semaphore.
const MaxLimit = 10000

// Modal is implemented by drivers that take claims in modes besides
// Exclusive. Every method that takes a Claim (Refresh, Release,
// Queuer.Enqueue, BatchRefresher.RefreshMany, Lingerer.Linger) then takes
// claims in those modes too, and a Notifier's subscription to a key
// reports releases of any of the key's objects (a wake-up too many costs
// one try). Inspector, Lister and Breaker see each object by its mode.
//
// The rules for each mode, judged by the store like a lock's TTL:
//
//   - Every grant of an object has a fence strictly greater than that of
//     every earlier grant of the same object (the semaphore's permits and
//     the read-write lock's readers and writers count as grants).
//   - Permit: TryAcquire grants c.Weight permits while the weights of
//     the unexpired grants plus c.Weight are at most c.Limit. A claim's
//     weight is one grant, all or nothing: one fence, one holder, one
//     token, refreshed and released whole. All of a semaphore's permits
//     carry one limit: a claim whose Limit differs from that of the held
//     permits fails with ErrLimitMismatch and leaves nothing; once none
//     is held, the next claim's limit holds. A limit set by Resizer.Resize
//     overrides every claim's Limit while it stands (see Resizer).
//   - Read: granted while no unexpired writer holds the key and no other
//     writer waits (below).
//   - Write: granted while no unexpired reader or writer holds the key.
//     Writers are preferred, so that a stream of readers cannot starve
//     them. An ordered queue (Queuer) serves readers and writers in
//     arrival order (a reader enters when no writer is ahead of it, a
//     writer when it is first). Any other driver records a waiting
//     writer, in its queue's tries too: a TryAcquire of Write
//     that fails records c.Token as the key's waiting writer until c.TTL
//     from then, unless another token's record is unexpired; a later
//     TryAcquire by the same token renews it, and the grant clears it.
//     While the record lives, readers are refused. Release of a Write
//     claim whose token does not hold the key removes that token's
//     record and returns ErrNotHeld: the locker package calls it when a
//     writer stops trying without the lock.
type Modal interface {
	Modes() ModeSet
}

// Resizer is implemented by Modal drivers whose store keeps a limit that
// an operator sets on a semaphore in use.
type Resizer interface {
	// Resize sets the limit of key's semaphore to limit, 1 to MaxLimit
	// (checked by the locker package), until the next Resize; limit 0
	// removes the limit Resize set. While one stands, every Permit claim
	// of key is judged under it whatever its own Limit (never
	// ErrLimitMismatch, unless the claim's Weight exceeds it), holders
	// above it keep their permits until they release or expire, and
	// Inspect reports it as State.Limit. It is kept in the store without
	// expiry: one record per resized semaphore, until removed. Once it is
	// removed, claims' own Limits rule again: while permits granted under
	// it are held, a claim whose Limit differs from theirs may fail with
	// ErrLimitMismatch. A raised limit wakes waiters as a release does.
	Resize(ctx context.Context, key string, limit int) error
}

// Weigher is implemented by Modal drivers that take Permit claims of any
// Weight. Elsewhere every Permit claim has Weight 1: the locker package
// refuses more with ErrUnsupported before any network call, since a
// driver that counts grants, not weights, would let a claim of n permits
// in as one.
type Weigher interface {
	// Weighs reports whether the driver takes weights above 1.
	Weighs() bool
}
