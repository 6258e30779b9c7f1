package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// Modes implements backend.Modal: semaphores and read-write locks. It is no
// backend.Weigher: n permits would be n slot items, which memcached cannot
// take in one step (locker.Permits above 1 is ErrUnsupported).
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// A key's semaphore and read-write lock are items apart from its lock:
// objKey(K, tag) is a prefix of K's own, then ':' and a tag. The prefix
// escapes ':' (backend.ShortKey), so no such item is named like a lock or
// its counter (which end in ":f"), and the tags tell the items apart:
//
//	s<i>  the semaphore's permit slot i, 0 <= i < limit
//	sl    the semaphore's limit record (semaphore.go)
//	sf    the semaphore's fence counter
//	w     the read-write lock's writer
//	q     its waiting writer's record
//	r<i>  its reader slot i, 0 <= i < maxReaders
//	rf    its fence counter
const maxTag = len(":s9999")

func objKey(key, tag string) string { return objBase(key) + tag }

// objBase is what objKey puts before the tag; slotKeys names slots off it.
func objBase(key string) string { return backend.ShortKey(key, maxItemKey-maxTag) + ":" }

func slotKeys(base, tag string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = base + tag + strconv.Itoa(i)
	}
	return keys
}

// slots are the slot items of c's semaphore (Permit) or read-write lock
// (Read), the one c.Token tries first (so that Refresh and Release find it
// in one get as a rule, and concurrent claimants spread out), and what
// names them in errors.
func slots(c backend.Claim) (keys []string, pref int, what string) {
	if c.Mode == backend.Permit {
		return slotKeys(objBase(c.Key), "s", c.Limit), backend.OneOf(c.Token, c.Limit), "permit"
	}
	return slotKeys(objBase(c.Key), "r", MaxReaders), backend.OneOf(c.Token, MaxReaders), "reader"
}

// heldByOther reports whether an item names a holder other than token
// (tombstones name none).
func heldByOther(it *memcache.Item, token string) bool {
	return it != nil && !isTombstone(it.Value) && !heldBy(it.Value, token)
}

// getMulti is GetMulti, repeated once on a stale pooled connection.
func (d *Driver) getMulti(ctx context.Context, keys []string) (items map[string]*memcache.Item, err error) {
	err = d.retried(ctx, func() (err error) { items, err = d.mc.GetMulti(keys); return err })
	return items, err
}

func (d *Driver) touch(ctx context.Context, key string, exp int32) error {
	return d.retried(ctx, func() error { return d.mc.Touch(key, exp) })
}

// takeSlot stores value in one of the slots keys for token, trying pref
// first, then those a look at all of them finds free (check, if not nil,
// judges that look first). It returns the slot taken, or -1 when none was.
func (d *Driver) takeSlot(ctx context.Context, keys []string, pref int, value []byte, exp int32, token string, check func(map[string]*memcache.Item) error) (int, error) {
	var items map[string]*memcache.Item // nil until pref was found taken
	for j, tries := 0, 0; j < len(keys) && tries <= maxAttempts; j++ {
		i := (pref + j) % len(keys)
		if heldByOther(items[keys[i]], token) {
			continue
		}
		tries++
		if err := live(ctx, "acquire"); err != nil {
			return -1, err
		}
		won, _, err := d.claim(ctx, &memcache.Item{Key: keys[i], Value: value, Expiration: exp}, token)
		if err != nil {
			d.backOut(ctx, keys[i], token, false)
			return -1, err
		}
		if won {
			return i, nil
		}
		if items != nil {
			continue
		}
		if items, err = d.getMulti(ctx, keys); err != nil {
			return -1, fmt.Errorf("memcachelock: gets: %w", err)
		}
		if check != nil {
			if err := check(items); err != nil {
				return -1, err
			}
		}
	}
	return -1, nil
}

// findSlot returns the item (with its cas id) of the slot that token
// holds: pref's, as a rule, or the one a look at all of them finds.
func (d *Driver) findSlot(ctx context.Context, what string, keys []string, pref int, token string) (*memcache.Item, error) {
	it, err := d.get(ctx, keys[pref])
	switch {
	case err == nil && heldBy(it.Value, token):
		return it, nil
	case err != nil && !errors.Is(err, memcache.ErrCacheMiss):
		return nil, fmt.Errorf("memcachelock: gets: %w", err)
	}
	items, err := d.getMulti(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("memcachelock: gets: %w", err)
	}
	for _, k := range keys {
		if it := items[k]; it != nil && heldBy(it.Value, token) {
			return it, nil
		}
	}
	return nil, fmt.Errorf("memcachelock: %w: no %s (expired, evicted, released or the server restarted)", backend.ErrNotHeld, what)
}

// refreshSlot extends the slot of c (see slots) to exp.
func (d *Driver) refreshSlot(ctx context.Context, c backend.Claim, exp int32) error {
	keys, pref, what := slots(c)
	it, err := d.findSlot(ctx, what, keys, pref, c.Token)
	if err != nil {
		return err
	}
	return d.extend(ctx, "refresh", what, it.Key, c.Token, exp)
}

// releaseSlot frees the slot of c (see slots).
func (d *Driver) releaseSlot(ctx context.Context, c backend.Claim) error {
	keys, pref, what := slots(c)
	cur, err := d.findSlot(ctx, what, keys, pref, c.Token)
	if err != nil {
		return err
	}
	// The item found holding our token, with its cas id: the cas frees it
	// only if it is unchanged since (a round trip saved); else (a
	// concurrent refresh of ours) casHeld looks again.
	_, err = d.casHeld(ctx, "release", what, cur.Key, cur, heldCheck(c.Token), tombstoneOf, d.cas)
	return err
}
