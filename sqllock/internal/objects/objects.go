// Package objects makes the operator's states of semaphores and
// read-write locks from the rows of the shared tables, which every SQL
// dialect keeps alike: a row per holder, its kind (1 permit, 2 reader, 3
// writer), owner, fence, expiry and lim (see package lim); and a
// resized semaphore's limit record (kind 5), which Resize keeps.
package objects

import (
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/lim"
)

// The kinds of the holders' rows that are not readers.
const (
	kindPermit = 1
	kindWrite  = 3
	// KindLimit is a resized semaphore's record: its lim is the limit
	// (backend.Resizer), its token RecordToken, and it never expires.
	KindLimit = 5
)

// RecordToken is the token of a limit record: no core token (hex) is it,
// so no claim's row takes its place.
const RecordToken = "(limit)"

// Known is what the tables record of object m's holders (m is Permit or
// Read): owner, fence and expiry of each, and a semaphore's limit.
// Waiters poll or listen and leave no trace.
func Known(m backend.Mode) backend.Fields {
	k := backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL | backend.KnowsHolders
	if m == backend.Permit {
		k |= backend.KnowsLimit
	}
	return k
}

// Free is the state of key's object m without a live holder.
func Free(key string, m backend.Mode) backend.State {
	return backend.State{Key: key, Mode: m, Known: Known(m)}
}

// Add adds a live holder's row of key's object m to out, rows coming
// sorted by key and then fence: to out's last state when that is key's
// (a page of rows may split an object's), else to a new one. us is the
// time left, in µs.
func Add(out []backend.State, m backend.Mode, key string, kind int, owner string, fence, packed, us int64) []backend.State {
	if len(out) == 0 || out[len(out)-1].Key != key {
		out = append(out, Free(key, m))
	}
	st := &out[len(out)-1]
	if kind == KindLimit {
		st.Limit = int(packed) // the holders' own, which Resize made it
		return out
	}
	h := backend.Holder{Mode: backend.Read, Owner: owner, Fence: uint64(fence), TTL: time.Duration(us) * time.Microsecond, Weight: 1}
	switch kind {
	case kindPermit:
		h.Mode = backend.Permit
		st.Limit, h.Weight = lim.Split(int(packed))
	case kindWrite:
		h.Mode = backend.Write
	}
	st.Held, st.Holders = true, append(st.Holders, h)
	return out
}
