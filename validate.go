package locker

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lockerhq/locker/backend"
)

// MaxNameLen is the longest lock name, in bytes, that every backend accepts.
const MaxNameLen = backend.MaxNameLen

// CheckName reports, wrapping ErrInvalidName, why name is not a lock name:
// every non-empty valid UTF-8 string without NUL of at most MaxNameLen
// bytes is one. Backends encode what their stores cannot hold, so the same
// names work everywhere. Acquire checks every name; tools that take names
// from users (lockctl) check them the same way before they connect.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidName)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: contains NUL", ErrInvalidName)
	}
	return nil
}

// CheckPrefix reports, wrapping ErrInvalidName, why prefix cannot start a
// lock name for List: "" (every name) and any valid UTF-8 string without
// NUL of at most MaxNameLen bytes can.
func CheckPrefix(prefix string) error {
	if len(prefix) > MaxNameLen || !utf8.ValidString(prefix) || strings.IndexByte(prefix, 0) >= 0 {
		return fmt.Errorf("%w: prefix must be valid UTF-8 without NUL, at most %d bytes", ErrInvalidName, MaxNameLen)
	}
	return nil
}

// checkNamespace accepts 1 to 64 bytes of [A-Za-z0-9._-]. Without '/', a
// namespace and a name join into a key that no other pair produces.
func checkNamespace(ns string) error {
	if ns == "" || len(ns) > backend.MaxNamespaceLen {
		return fmt.Errorf("%w: namespace must be 1 to %d bytes, got %d", ErrInvalidName, backend.MaxNamespaceLen, len(ns))
	}
	for _, r := range ns {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%w: namespace %q: only letters, digits, '.', '_' and '-'", ErrInvalidName, ns)
		}
	}
	return nil
}

// MaxLabelLen is the longest label (see WithLabel), in bytes: every
// backend records one this long whole.
const MaxLabelLen = 64

// CheckLabel reports, wrapping ErrInvalidName, why label cannot label a
// holder: any valid UTF-8 string without NUL of at most MaxLabelLen bytes
// can, "" included (a holder that says nothing of itself).
func CheckLabel(label string) error {
	if len(label) > MaxLabelLen || !utf8.ValidString(label) || strings.IndexByte(label, 0) >= 0 {
		return fmt.Errorf("%w: label %q: want valid UTF-8 without NUL, at most %d bytes", ErrInvalidName, label, MaxLabelLen)
	}
	return nil
}

// MaxTTL bounds a lock's TTL. A longer one is almost always a unit mistake,
// and some stores cannot express it.
const MaxTTL = 30 * 24 * time.Hour

// CheckTTL reports, wrapping ErrInvalidTTL, a TTL that is not more than 0
// and at most MaxTTL.
func CheckTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > MaxTTL {
		return fmt.Errorf("%w: %v (want more than 0, at most %v)", ErrInvalidTTL, ttl, MaxTTL)
	}
	return nil
}

// MaxLimit bounds a semaphore's limit (see Semaphore).
const MaxLimit = backend.MaxLimit

// CheckLimit reports, wrapping ErrInvalidLimit, a semaphore limit that is
// not 1 to MaxLimit.
func CheckLimit(limit int) error {
	if limit < 1 || limit > MaxLimit {
		return fmt.Errorf("%w: %d (want 1 to %d)", ErrInvalidLimit, limit, MaxLimit)
	}
	return nil
}
