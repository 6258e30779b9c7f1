package memcachelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// A semaphore of limit L is L slot items, s0 to s<L-1>, taken with add,
// and a limit record (sl) written after the add, which makes a claim under
// another limit fail with ErrLimitMismatch while permits of one are held.
// Why that holds: docs/backends/memcachelock.md, "The limit record".

// permitValue is a permit slot's value: the token and the limit.
func permitValue(token string, limit int) []byte {
	return strconv.AppendInt(append([]byte(token), ' '), int64(limit), 10)
}

// permitLimit reads the limit from a permit slot's value.
func permitLimit(v []byte) (int, bool) {
	_, l, ok := bytes.Cut(v, []byte(" "))
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(l))
	return n, err == nil
}

// checkLimit rejects a limit the locker package would not send.
func checkLimit(limit int) error {
	if limit < 1 || limit > backend.MaxLimit {
		return fmt.Errorf("memcachelock: %w: %d (want 1 to %d)", backend.ErrInvalidLimit, limit, backend.MaxLimit)
	}
	return nil
}

// otherLimit returns the limit of a permit among items held under another
// limit than ours, by another token.
func otherLimit(items map[string]*memcache.Item, token string, limit int) (int, bool) {
	for _, it := range items {
		if !heldByOther(it, token) {
			continue
		}
		if l, ok := permitLimit(it.Value); !ok || l != limit {
			return l, true
		}
	}
	return 0, false
}

func (d *Driver) tryPermit(ctx context.Context, c backend.Claim, exp int32, eff time.Duration) (backend.Grant, error) {
	base := objBase(c.Key)
	keys, pref, _ := slots(c)
	slot, err := d.takeSlot(ctx, keys, pref, permitValue(c.Token, c.Limit), exp, c.Token,
		func(items map[string]*memcache.Item) error {
			if l, ok := otherLimit(items, c.Token, c.Limit); ok {
				return fmt.Errorf("memcachelock: %w", backend.HeldUnder(l, c.Limit))
			}
			return nil
		})
	if err != nil {
		return backend.Grant{}, err
	}
	if slot < 0 {
		return backend.Grant{}, fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
	}
	if err := live(ctx, "acquire"); err != nil {
		return d.backedOut(ctx, keys[slot], c.Token, err)
	}
	// The draw reads the limit record too (after our add, as markLimit's
	// own gets would), in the same write when it can: a round trip saved.
	fence, rec, addr, err := d.drawFence(base+"sl", base+"sf", eff)
	if err != nil {
		return d.backedOut(ctx, keys[slot], c.Token, err)
	}
	if err := d.markLimit(ctx, base, c, max(exp, d.fenceExp), rec, addr != nil); err != nil {
		return d.backedOut(ctx, keys[slot], c.Token, err)
	}
	return backend.Grant{Fence: fence, TTL: eff}, nil
}

// backOut takes back an item of a failed acquisition, if token still holds
// it, so that the call leaves nothing behind: whoever tries next finds the
// name free. It waits at most CancelGrace (on a dead connection a round trip
// takes the client's timeout); the rest goes on in the background, which
// Close awaits. Best effort: unreachable, the item expires after its TTL.
// The undo of a refused call (refused) is waited for while ctx lives: the
// locker package tries a refused token again, claim keeps an item of its
// token, and an undo still running would free that try's grant. It reports
// whether the undo is done.
func (d *Driver) backOut(ctx context.Context, key, token string, refused bool) bool {
	drop := func() { _ = d.drop(context.Background(), "release", "item", key, token) }
	fin := make(chan struct{})
	if !d.spawn(func() { defer close(fin); drop() }) {
		drop() // closing: within the caller's call, which Close awaits
		return true
	}
	if refused {
		select {
		case <-fin:
			return true
		case <-ctx.Done():
		}
	}
	t := time.NewTimer(backend.CancelGrace)
	defer t.Stop()
	select {
	case <-fin:
		return true
	case <-t.C:
		return false
	}
}

// backedOut is a failed acquisition's end: backOut, then err; or, for a
// refusal whose undo still runs (ctx ended), ctx's end, so that nothing
// tries the token again.
func (d *Driver) backedOut(ctx context.Context, key, token string, err error) (backend.Grant, error) {
	refused := errors.Is(err, backend.ErrNotAcquired)
	if !d.backOut(ctx, key, token, refused) && refused {
		err = fmt.Errorf("memcachelock: acquire: %w", context.Cause(ctx))
	}
	return backend.Grant{}, err
}

// markLimit writes c.Limit into the limit record (see above), or returns
// ErrLimitMismatch when permits of another limit are held. If read, rec
// is the record as read after our add (nil: missing), for its first look.
func (d *Driver) markLimit(ctx context.Context, base string, c backend.Claim, exp int32, rec *memcache.Item, read bool) error {
	rk := base + "sl"
	val := []byte(strconv.Itoa(c.Limit))
	for i := range maxAttempts {
		cur, err := rec, error(nil)
		switch {
		case i > 0 || !read:
			cur, err = d.get(ctx, rk)
		case rec == nil:
			err = memcache.ErrCacheMiss
		}
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			err := d.add(ctx, &memcache.Item{Key: rk, Value: val, Expiration: exp})
			switch {
			case err == nil:
				return nil
			case errors.Is(err, memcache.ErrNotStored):
				continue // written since our get: read it
			}
			return fmt.Errorf("memcachelock: add: %w", err)
		case err != nil:
			return fmt.Errorf("memcachelock: gets: %w", err)
		}
		if m, err := strconv.Atoi(string(cur.Value)); err == nil && m != c.Limit && m >= 1 && m <= backend.MaxLimit {
			// The record says M: write over it only if no permit of
			// another limit is held in M's slots.
			items, err := d.getMulti(ctx, slotKeys(base, "s", m))
			if err != nil {
				return fmt.Errorf("memcachelock: gets: %w", err)
			}
			if l, ok := otherLimit(items, c.Token, c.Limit); ok {
				return fmt.Errorf("memcachelock: %w", backend.HeldUnder(l, c.Limit))
			}
		}
		cur.Value, cur.Expiration = val, exp
		err = d.cas(ctx, cur)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored):
			continue // changed since our gets: look again
		}
		return fmt.Errorf("memcachelock: cas: %w", err)
	}
	return fmt.Errorf("memcachelock: %w: the semaphore's limit record kept changing", backend.ErrNotAcquired)
}

func (d *Driver) refreshPermit(ctx context.Context, c backend.Claim, exp int32) error {
	base := objBase(c.Key)
	if err := d.refreshSlot(ctx, c, exp); err != nil {
		return err
	}
	// The limit record must outlive every permit. Missing (evicted), it
	// is written again unless another was written since.
	rexp := max(exp, d.fenceExp)
	err := d.touch(ctx, base+"sl", rexp)
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = d.add(ctx, &memcache.Item{Key: base + "sl", Value: []byte(strconv.Itoa(c.Limit)), Expiration: rexp})
		if errors.Is(err, memcache.ErrNotStored) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("memcachelock: touch: %w", err)
	}
	return nil
}
