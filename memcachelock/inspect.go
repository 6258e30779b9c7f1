package memcachelock

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
)

// An item records its holder's owner and fence (see fencedValue); no TTL
// (memcached cannot tell an item's time left), no queue (waiters leave at
// most a mark), no List (memcached cannot enumerate its keys).

// errNoHolders refuses to inspect or break a semaphore or a read-write lock,
// before any request: their slot items record no fence (drawn after the add
// and told only to the acquirer; writing it in would cost every acquisition
// a round trip), so no fence names the item (docs/backends/memcachelock.md,
// Operators).
var errNoHolders = fmt.Errorf("memcachelock: %w: the items of a semaphore's or read-write lock's holders record no fence", backend.ErrUnsupported)

// state is the State of a held lock's value.
func state(key string, v []byte) backend.State {
	fence, _, owner := parseValue(v)
	st := backend.State{Key: key, Held: true, Owner: owner, Known: backend.KnowsOwner}
	if fence != 0 {
		st.Fence, st.Known = fence, st.Known|backend.KnowsFence
	}
	return st
}

// Inspect implements backend.Inspector with one get of the lock's item and
// its fence counter. A holder whose acquisition has not yet recorded its
// fence (between its add and its confirmation, or an item of an older
// version) is reported without one; so is a piped fence that the counter
// does not show (see pipedMark).
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, errNoHolders
	}
	ctx, done, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	lk := lockKey(key)
	fk := lk + fenceSuffix // fenceKey(key)
	items, err := d.getMulti(ctx, []string{lk, fk})
	if err != nil {
		return backend.State{}, fmt.Errorf("memcachelock: %w", err)
	}
	if cur := items[lk]; cur != nil && !isTombstone(cur.Value) {
		st := state(key, cur.Value)
		if _, piped, _ := parseValue(cur.Value); piped && !shows(items[fk], st.Fence) {
			st.Fence, st.Known = 0, backend.KnowsOwner
		}
		return st, nil
	}
	return backend.State{Key: key, Known: backend.KnowsOwner | backend.KnowsFence}, nil
}

// Break implements backend.Breaker as a release under the fence: gets, then
// a cas to the tombstone, if the item still shows fence. A piped fence
// counts without a look at the counter, which a late release's incr may have
// moved: one never granted was told to nobody (Inspect hides it), and its
// acquisition, its item gone, is refused. The removed holder's next Refresh
// finds no item; the counter is untouched, so the next grant's fence is above.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, errNoHolders
	}
	ctx, done, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	cur, err := d.casHeld(ctx, "", "lock", lockKey(key), nil, func(v []byte) error {
		if st := state(key, v); isTombstone(v) || !st.Known.Has(backend.KnowsFence) || st.Fence != fence {
			return fmt.Errorf("memcachelock: %w", backend.ErrNotHeld)
		}
		return nil
	}, tombstoneOf, d.cas)
	if err != nil {
		return backend.State{}, err
	}
	return state(key, cur.Value), nil
}
