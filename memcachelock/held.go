package memcachelock

import (
	"sync"
	"time"
)

// heldItems remembers, for the locks this driver holds, the lock item as
// its acquisition last read it (value and cas id, read after the
// confirming cas, in the same write: see confirm). Release then frees the
// lock with a cas on that cas id alone, one round trip instead of gets and
// cas. Safe because memcached gives every version of an item a new cas id:
// the cas succeeds only if the item is still the very one we read, held
// by our token, with the value we remember (whose waiter marks Release
// reads); anything since (a refresh, an appended mark, an expiry, a Break,
// a restart) makes it fail, and Release takes the long way. One exception:
// a restarted memcached numbers cas ids from 1 again, so another item of
// the key could carry the remembered id. None can exist before the hold's
// TTL has passed when the restart check covers that TTL (a restarted
// server grants the name only once it has run for the TTL; restart.go):
// so the cas id is used only within the hold's TTL, and not at all when
// WithRestartDelay is shorter than the TTL.
type heldItems struct {
	mu    sync.Mutex
	m     map[heldKey]heldItem
	swept int // entries the last sweep left
}

type heldKey struct{ key, token string }

type heldItem struct {
	cas   uint64
	value []byte
	until time.Time // the hold's end, after which the entry is useless
}

// keep records the item token read holding key.
func (h *heldItems) keep(key, token string, cas uint64, value []byte, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[heldKey]heldItem{}
	}
	if len(h.m) >= 2*h.swept+64 {
		// Holds that were never released (lost, or their process kept
		// them to their TTL) go whenever the map has doubled: amortized
		// O(1) per entry.
		now := time.Now()
		for k, it := range h.m {
			if !now.Before(it.until) {
				delete(h.m, k)
			}
		}
		h.swept = len(h.m)
	}
	h.m[heldKey{key, token}] = heldItem{cas: cas, value: value, until: until}
}

// take returns and forgets what keep recorded for token on key.
func (h *heldItems) take(key, token string) (heldItem, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	it, ok := h.m[heldKey{key, token}]
	if ok {
		delete(h.m, heldKey{key, token})
	}
	return it, ok
}
