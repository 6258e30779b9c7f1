package locker

import "github.com/lockerhq/locker/backend"

// Sentinel errors, for errors.Is. They are the same values as those of the
// backend package, so a driver's ErrNotAcquired is this ErrNotAcquired.
var (
	// ErrNotAcquired: the lock is held by someone else (TryAcquire), or the
	// wait ended (Acquire; the error also wraps the context's error).
	ErrNotAcquired = backend.ErrNotAcquired
	// ErrNotHeld: Release or Refresh of a lock this holder no longer holds:
	// it expired, was taken over or was released already.
	ErrNotHeld = backend.ErrNotHeld
	// ErrLost: the lock was lost while held. Lock.Err returns it, Do returns
	// it, and so does a re-entrant Acquire on a lost hold.
	ErrLost = backend.ErrLost
	// ErrClosed: the Client was closed.
	ErrClosed = backend.ErrClosed
	// ErrInvalidName: the name is empty, longer than MaxNameLen bytes, not
	// valid UTF-8 or contains NUL; or the namespace or a label is not
	// acceptable.
	ErrInvalidName = backend.ErrInvalidName
	// ErrInvalidTTL: the TTL is zero, negative or beyond what the backend
	// can express.
	ErrInvalidTTL = backend.ErrInvalidTTL
	// ErrUnsupported: the backend cannot do what was asked.
	ErrUnsupported = backend.ErrUnsupported
	// ErrInvalidURL: Open's URL is malformed, has an unknown scheme or an
	// unknown parameter.
	ErrInvalidURL = backend.ErrInvalidURL
	// ErrPermission: the store refused the credentials or an operation
	// locking needs. Acquire returns it at once instead of waiting.
	ErrPermission = backend.ErrPermission
	// ErrInvalidLimit: a semaphore's limit is not 1 to MaxLimit, or
	// Permits is not 1 to the limit or comes without Semaphore.
	ErrInvalidLimit = backend.ErrInvalidLimit
	// ErrInvalidOption: a driver constructor (New, Open's Options) was
	// given a nil client or an Option value out of its range.
	ErrInvalidOption = backend.ErrInvalidOption
	// ErrLimitMismatch: a semaphore's permits are held under another
	// limit than the one asked for.
	ErrLimitMismatch = backend.ErrLimitMismatch
	// ErrModeConflict: a Reentrant key asked to write a read-write lock it reads,
	// or to read one it writes.
	ErrModeConflict = backend.ErrModeConflict
)
