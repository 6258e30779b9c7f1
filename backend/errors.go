package backend

import "errors"

// The sentinel errors shared by the locker package and its drivers. The
// locker package re-exports each under the same name; errors.Is matches
// either spelling because they are the same values. Drivers return (or wrap)
// ErrNotAcquired, ErrNotHeld, ErrClosed, ErrUnsupported, ErrInvalidURL and
// ErrPermission; the others come from the locker package's own checks.
var (
	// ErrNotAcquired: the lock is held by someone else.
	ErrNotAcquired = errors.New("locker: not acquired")
	// ErrNotHeld: the token does not hold the lock (it expired, was taken
	// over, was released already, or never existed).
	ErrNotHeld = errors.New("locker: not held")
	// ErrLost: a held lock was found lost while its holder still used it.
	ErrLost = errors.New("locker: lock lost")
	// ErrClosed: the client or driver was closed.
	ErrClosed = errors.New("locker: closed")
	// ErrInvalidName: the lock name (or namespace) is not acceptable.
	ErrInvalidName = errors.New("locker: invalid name")
	// ErrInvalidTTL: the TTL is zero, negative or out of the backend's range.
	ErrInvalidTTL = errors.New("locker: invalid ttl")
	// ErrUnsupported: the backend cannot do what was asked.
	ErrUnsupported = errors.New("locker: unsupported")
	// ErrInvalidURL: a URL or DSN is malformed, names an unknown scheme or
	// carries an unknown parameter.
	ErrInvalidURL = errors.New("locker: invalid url")
	// ErrPermission: the store refused the client's identity (a wrong or
	// missing password or certificate) or an operation that locking needs
	// (a role or ACL without that permission). A configuration error:
	// never retried.
	ErrPermission = errors.New("locker: not permitted")
)

// NotAcquiredError is ErrNotAcquired for a reason other than another
// holder, such as a restarted server that refuses new grants for a while.
// The locker package passes the reason on to the caller, where it reports
// a plain ErrNotAcquired as just that. errors.Is(err, ErrNotAcquired)
// holds for it.
type NotAcquiredError struct {
	Reason string
}

func (e *NotAcquiredError) Error() string { return ErrNotAcquired.Error() + ": " + e.Reason }

// Is reports target == ErrNotAcquired.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }
