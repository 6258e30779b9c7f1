package memcachelock

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Key layout. A lock on key K lives in the item lockKey(K); its fencing
// counter in lockKey(K)+":f". backend.ShortKey escapes ':' (and spaces and
// control characters), so no lock item can be named like a counter, and it
// keeps both names within memcached's 250 bytes.
const (
	maxItemKey  = 250
	fenceSuffix = ":f"
)

func lockKey(key string) string  { return backend.ShortKey(key, maxItemKey-len(fenceSuffix)) }
func fenceKey(key string) string { return lockKey(key) + fenceSuffix }

// Values. A held lock's item holds the holder's token (32 hex digits), a
// space, '~' (or '^', see pipedMark) and the fence in decimal (0 until
// drawn), then, if the acquisition named an owner, a space and its first
// maxOwnerLen bytes, then any waiter marks (NUL, "w:" and a waiting
// driver's id; see Waiting). Items of older versions have no fence field
// (one whose owner starts with '~' or '^' and digits reads as having one).
// A released lock's item, if the server keeps it at all, is the tombstone.
const (
	tokenLen    = 32
	maxOwnerLen = 200
	tombstone   = "-"
	fenceMark   = '~'
	// pipedMark replaces fenceMark in an item that tryPiped added with a
	// fence not yet known usable: granted only if the counter, read back
	// after the add, shows it (else another is drawn). So Inspect reports
	// it only while the counter shows it, and the holder's refreshes
	// write fenceMark in its place (settle).
	pipedMark = '^'
)

// holdValue is the value an acquisition stores before it has its fence.
func holdValue(token, owner string) []byte { return fencedValue(token, 0, owner) }

// fencedValue is the value of a holder with fence (0: not drawn yet).
func fencedValue(token string, fence uint64, owner string) []byte {
	return holderValue(token, fenceMark, fence, owner)
}

// holderValue is a holder's value whose fence follows mark.
func holderValue(token string, mark byte, fence uint64, owner string) []byte {
	v := append([]byte(token), ' ', mark)
	v = strconv.AppendUint(v, fence, 10)
	if owner == "" {
		return v
	}
	if len(owner) > maxOwnerLen {
		owner = owner[:maxOwnerLen]
	}
	return append(append(v, ' '), owner...)
}

// parseValue splits a held lock's value into its fence (0 when it has
// none yet, or is of an older version), whether it follows pipedMark,
// and owner.
func parseValue(v []byte) (fence uint64, piped bool, owner string) {
	v = v[:len(v)-len(marks(v))]
	_, rest, ok := bytes.Cut(v, []byte(" "))
	if !ok {
		return 0, false, ""
	}
	if len(rest) > 1 && (rest[0] == fenceMark || rest[0] == pipedMark) {
		num, after, _ := bytes.Cut(rest[1:], []byte(" "))
		if n, err := strconv.ParseUint(string(num), 10, 64); err == nil {
			return n, rest[0] == pipedMark, string(after)
		}
	}
	return 0, false, string(rest)
}

// settle makes a piped fence in v, the value of a holder that was granted
// it, a plain one (in place): see pipedMark.
func settle(v []byte) {
	if _, piped, _ := parseValue(v); piped {
		v[bytes.IndexByte(v, ' ')+1] = fenceMark
	}
}

// checkToken rejects tokens that a value cannot carry unambiguously.
func checkToken(token string) error {
	if token == "" || token == tombstone || strings.ContainsAny(token, " \x00") {
		return fmt.Errorf("memcachelock: %w: a token must be non-empty, without spaces or NUL", backend.ErrUnsupported)
	}
	return nil
}

// heldBy reports whether an item's value says that token holds the lock.
func heldBy(v []byte, token string) bool {
	return checkToken(token) == nil && len(v) >= len(token) && string(v[:len(token)]) == token &&
		(len(v) == len(token) || v[len(token)] == ' ')
}

// isTombstone reports whether the value marks a released lock (with or
// without waiter marks). Anything else not the caller's, even a value we did
// not write, counts as held: a lock is never taken over a value we cannot read.
func isTombstone(v []byte) bool {
	return bytes.Equal(v, []byte(tombstone)) || (bytes.HasPrefix(v, []byte(tombstone)) && bytes.HasPrefix(v[len(tombstone):], []byte(markSep)))
}

// marks is the waiter marks appended to a lock item's value (see
// Waiting), empty if none.
func marks(v []byte) []byte {
	if i := bytes.Index(v, []byte(markSep)); i >= 0 {
		return v[i:]
	}
	return nil
}

// TTLs. memcached counts expiry in whole seconds on a clock whose ticks
// drift (docs/backends/memcachelock.md, "TTLs"): a TTL of d is stored for
// ceil(d)+2 seconds, so the lock lives at least ceil(d), the effective TTL.
// Relative expirations above 30 days are read as absolute Unix times: those
// TTLs are sent as such, relying on the server's clock agreeing with ours.
const expirationMargin = 2

const (
	maxRelative = 30 * 24 * 60 * 60 // seconds; memcached's REALTIME_MAXDELTA
	maxTTL      = 30 * 24 * time.Hour
	// releaseExpiration makes memcached treat an item as already expired:
	// a negative expiration is "immediately expired" in memcached's protocol.
	releaseExpiration = -1
)

// expiration converts a TTL into memcached's expiration field and the
// effective TTL.
func expiration(ttl time.Duration, now time.Time) (exp int32, eff time.Duration, err error) {
	if ttl <= 0 || ttl > maxTTL {
		return 0, 0, fmt.Errorf("memcachelock: %w: %v (want more than 0, at most %v)", backend.ErrInvalidTTL, ttl, maxTTL)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	n := secs + expirationMargin
	if n > maxRelative {
		n += now.Unix()
		if n > math.MaxInt32 {
			return 0, 0, fmt.Errorf("memcachelock: %w: %v: a TTL above 30 days minus 2s needs an absolute expiry, which gomemcache cannot send after 2038", backend.ErrInvalidTTL, ttl)
		}
	}
	return int32(n), time.Duration(secs) * time.Second, nil
}
