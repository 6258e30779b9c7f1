package memcachelock

import (
	"maps"
	"sync"
	"time"
)

// heldItems remembers the lock items of our holds as their acquisitions
// last read them, so that Release frees one with a cas on that cas id alone:
// anything since (a refresh, a mark, an expiry, a Break) makes it fail. A
// restarted memcached numbers cas ids from 1 again, so an entry is used only
// within the hold's TTL, and only when the restart check covers that TTL
// (docs/backends/memcachelock.md, "Releasing with one cas").
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
	// Holds never released (lost, or kept to their TTL) go.
	sweep(h.m, &h.swept, func(it heldItem, now time.Time) bool { return !now.Before(it.until) })
	h.m[heldKey{key, token}] = heldItem{cas: cas, value: value, until: until}
}

// take returns and forgets what keep recorded for token on key.
func (h *heldItems) take(key, token string) (heldItem, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	it, ok := h.m[heldKey{key, token}]
	delete(h.m, heldKey{key, token})
	return it, ok
}

// sweep deletes the entries of m that dead reports whenever m has doubled
// since the last sweep, which left *left: amortized O(1) per entry.
func sweep[K comparable, V any](m map[K]V, left *int, dead func(V, time.Time) bool) {
	if len(m) < 2*(*left)+64 {
		return
	}
	now := time.Now()
	maps.DeleteFunc(m, func(_ K, v V) bool { return dead(v, now) })
	*left = len(m)
}
