package memcachelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// An item records its holder's owner and, once its acquisition completed,
// its fence (see fencedValue). memcached cannot report how long an item
// has left, and the value keeps no deadline: no TTL. Waiters keep no
// entry of their own (at most a mark in the holder's item): no queue. There is no List: memcached cannot enumerate its keys.

// state is the State of a held lock's value.
func state(key string, v []byte) backend.State {
	fence, owner := parseValue(v)
	st := backend.State{Key: key, Held: true, Owner: owner, Known: backend.KnowsOwner}
	if fence != 0 {
		st.Fence, st.Known = fence, st.Known|backend.KnowsFence
	}
	return st
}

// Inspect implements backend.Inspector with one get of the lock's item. A
// holder whose acquisition has not yet recorded its fence (between its add
// and its confirmation, or an item of an older version) is reported
// without one.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.State, error) {
	ctx, done, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	cur, err := d.get(lockKey(key))
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
	case err != nil:
		return backend.State{}, fmt.Errorf("memcachelock: %w", err)
	case !isTombstone(cur.Value):
		return state(key, cur.Value), nil
	}
	return backend.State{Key: key, Known: backend.KnowsOwner | backend.KnowsFence}, nil
}

// Break implements backend.Breaker as a release under the fence: gets,
// then a cas to an expired tombstone that succeeds only if the item is
// still the one whose value shows fence. The removed holder's next Refresh
// finds no item; the key's fence counter is untouched, so the next grant's
// fence is above (see nextFence).
func (d *Driver) Break(ctx context.Context, key string, fence uint64) (backend.State, error) {
	ctx, done, err := d.begin(ctx, "")
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	cur, err := d.casHeld(ctx, "", "lock", lockKey(key), func(v []byte) error {
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
