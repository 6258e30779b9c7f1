package backend

import (
	"errors"
	"fmt"
	"time"
)

// The sentinel errors shared by the locker package and its drivers. Their
// messages carry no prefix: whoever wraps one says where it came from once
// ("locker: try-acquire \"job\": not acquired"). The
// locker package re-exports each under the same name; errors.Is matches
// either spelling because they are the same values. Drivers return (or wrap)
// ErrNotAcquired, ErrNotHeld, ErrClosed, ErrUnsupported, ErrInvalidURL,
// ErrInvalidOption and ErrPermission; the others come from the locker package's own checks.
var (
	// ErrNotAcquired: the lock is held by someone else.
	ErrNotAcquired = errors.New("not acquired")
	// ErrNotHeld: the token does not hold the lock (it expired, was taken
	// over, was released already, or never existed).
	ErrNotHeld = errors.New("not held")
	// ErrLost: a held lock was found lost while its holder still used it.
	ErrLost = errors.New("lock lost")
	// ErrClosed: the client or driver was closed.
	ErrClosed = errors.New("closed")
	// ErrInvalidName: the lock name (or namespace) is not acceptable.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidTTL: the TTL is zero, negative or out of the backend's range.
	ErrInvalidTTL = errors.New("invalid ttl")
	// ErrUnsupported: the backend cannot do what was asked.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalidURL: a URL or DSN is malformed, names an unknown scheme or
	// carries an unknown parameter.
	ErrInvalidURL = errors.New("invalid url")
	// ErrPermission: the store refused the client's identity (a wrong or
	// missing password or certificate) or an operation that locking needs
	// (a role or ACL without that permission). A configuration error:
	// never retried.
	ErrPermission = errors.New("not permitted")
	// ErrInvalidLimit: a semaphore's limit is not 1 to MaxLimit, or a
	// claim's weight is not 1 to its limit.
	ErrInvalidLimit = errors.New("invalid semaphore limit")
	// ErrInvalidOption: a driver constructor's argument or Option is out of
	// its range (a nil client, a negative delay). A URL's parameters get
	// ErrInvalidURL instead.
	ErrInvalidOption = errors.New("invalid option")
	// ErrModeConflict: an owner asked for a name it holds in another mode
	// (a reader asking to write, a writer asking to read).
	ErrModeConflict = errors.New("held in another mode")
	// ErrLimitMismatch: a semaphore's permits are held under one limit
	// and a claim asks with another. The callers disagree on what the
	// semaphore is; waiting would not mend it.
	ErrLimitMismatch = errors.New("semaphore limit differs from its holders'")
)

// HeldUnder is ErrLimitMismatch for a claim with limit asked of a
// semaphore whose permits are held under held (a limit, or a range such
// as "2 to 3").
func HeldUnder(held any, asked int) error {
	return fmt.Errorf("%w: held under %v, asked with %d", ErrLimitMismatch, held, asked)
}

// ResizedTo is ErrLimitMismatch for a claim of weight permits of a
// semaphore resized to limit, below it.
func ResizedTo(weight int, limit any) error {
	return fmt.Errorf("%w: %d permits asked of a semaphore resized to %v", ErrLimitMismatch, weight, limit)
}

// Permanent reports errors that sending the request again cannot mend: a
// closed client or driver, bad input, an unsupported request, a refused
// identity or permission. Every other error of a driver is a failure to
// reach or use the store, which the locker package and the drivers' own
// loops retry for up to StoreFailureBudget. ErrNotAcquired and ErrNotHeld
// are answers, not failures: they are not permanent, and nobody retries
// them as failures either.
func Permanent(err error) bool {
	for _, e := range []error{ErrClosed, ErrInvalidName, ErrInvalidTTL, ErrUnsupported, ErrInvalidURL, ErrInvalidOption, ErrPermission, ErrLimitMismatch, ErrInvalidLimit, ErrModeConflict} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// StoreFailureBudget is how long a blocking acquisition rides out failures
// to reach the store in a row (a restart, a failover, a blip) before it
// returns the store's error. The locker package applies it to every
// wait, queued (Queuer) or not.
const StoreFailureBudget = 5 * time.Second

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
