package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// MaxReaders is how many readers a read-write lock holds at once (a writer
// reads all their slot items in one round trip). A reader beyond it waits,
// refused with a backend.NotAcquiredError that says why.
const MaxReaders = 128

// A read-write lock excludes by "write mine, then check theirs": each side
// adds its own item, draws its fence, then reads the other side's and backs
// out if it is held (docs/backends/memcachelock.md, "Read-write locks").
// Writers are preferred: a refused writer records itself in q, and readers
// are refused while q names another token.

func (d *Driver) tryRead(ctx context.Context, c backend.Claim, exp int32, eff time.Duration) (backend.Grant, error) {
	base := objBase(c.Key)
	keys, pref, _ := slots(c)
	wk, qk := base+"w", base+"q"
	busy := func(items map[string]*memcache.Item) error {
		if heldByOther(items[wk], c.Token) || heldByOther(items[qk], c.Token) {
			return fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
		}
		return nil
	}
	// A look first, so that a reader adds no slot while a writer holds or
	// waits: slots that come and go would keep a waiting writer out.
	items, err := d.getMulti(ctx, []string{wk, qk})
	if err != nil {
		return backend.Grant{}, fmt.Errorf("memcachelock: gets: %w", err)
	}
	if err := busy(items); err != nil {
		return backend.Grant{}, err
	}
	slot, err := d.takeSlot(ctx, keys, pref, []byte(c.Token), exp, c.Token, nil)
	if err != nil {
		return backend.Grant{}, err
	}
	if slot < 0 {
		return backend.Grant{}, fmt.Errorf("memcachelock: %w", &backend.NotAcquiredError{Reason: fmt.Sprintf("all %d reader slots are held", MaxReaders)})
	}
	fence, items, err := d.fenceThenRead(ctx, base, eff, []string{wk, qk, keys[slot]})
	if err == nil {
		err = busy(items)
	}
	if err != nil {
		return d.backedOut(ctx, keys[slot], c.Token, err)
	}
	if it := items[keys[slot]]; it == nil || !heldBy(it.Value, c.Token) {
		return backend.Grant{}, fmt.Errorf("memcachelock: %w: the reader's slot expired or was evicted before the acquisition completed", backend.ErrNotAcquired)
	}
	return backend.Grant{Fence: fence, TTL: eff}, nil
}

func (d *Driver) tryWrite(ctx context.Context, c backend.Claim, exp int32, eff time.Duration) (backend.Grant, error) {
	base := objBase(c.Key)
	wk, qk := base+"w", base+"q"
	won, _, err := d.claim(ctx, &memcache.Item{Key: wk, Value: []byte(c.Token), Expiration: exp}, c.Token)
	if err != nil {
		return d.backedOut(ctx, wk, c.Token, err)
	}
	if !won {
		return backend.Grant{}, d.waitWrite(ctx, qk, c.Token, exp)
	}
	keys := append(slotKeys(base, "r", MaxReaders), wk, qk)
	fence, items, err := d.fenceThenRead(ctx, base, eff, keys)
	if err != nil {
		return d.backedOut(ctx, wk, c.Token, err)
	}
	if it := items[wk]; it == nil || !heldBy(it.Value, c.Token) {
		return backend.Grant{}, fmt.Errorf("memcachelock: %w: the writer's item expired or was evicted before the acquisition completed", backend.ErrNotAcquired)
	}
	for _, k := range keys[:MaxReaders] {
		if heldByOther(items[k], c.Token) {
			return d.backedOut(ctx, wk, c.Token, d.waitWrite(ctx, qk, c.Token, exp))
		}
	}
	if q := items[qk]; q != nil && heldBy(q.Value, c.Token) {
		// Granted: our record of waiting goes. If the cas fails, the
		// record changed or expired since: it is not ours to clear.
		_ = d.cas(ctx, tombstoneOf(q))
	}
	return backend.Grant{Fence: fence, TTL: eff}, nil
}

// fenceThenRead draws the fence of base's read-write lock, our item added,
// then reads keys, the other side's items and ours.
func (d *Driver) fenceThenRead(ctx context.Context, base string, eff time.Duration, keys []string) (uint64, map[string]*memcache.Item, error) {
	if err := live(ctx, "acquire"); err != nil {
		return 0, nil, err
	}
	fence, _, _, err := d.drawFence("", base+"rf", eff)
	if err != nil {
		return 0, nil, err
	}
	items, err := d.getMulti(ctx, keys)
	if err != nil {
		return 0, nil, fmt.Errorf("memcachelock: gets: %w", err)
	}
	return fence, items, nil
}

// waitWrite records token as the waiting writer, unless another token's
// record lives, and returns the refusal.
func (d *Driver) waitWrite(ctx context.Context, qk, token string, exp int32) error {
	refused := fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
	if err := live(ctx, "acquire"); err != nil {
		return refused
	}
	if _, _, err := d.claim(ctx, &memcache.Item{Key: qk, Value: []byte(token), Expiration: exp}, token); err != nil {
		// Perhaps stored: Release of this claim, which the locker package
		// sends when the writer gives up, removes it; else its TTL does.
		return fmt.Errorf("memcachelock: waiting writer: %w", err)
	}
	return refused
}

// releaseWrite frees the writer's item, or, when c.Token does not hold
// it, withdraws c.Token's record of waiting and reports ErrNotHeld.
func (d *Driver) releaseWrite(ctx context.Context, c backend.Claim) error {
	base := objBase(c.Key)
	err := d.drop(ctx, "release", "writer", base+"w", c.Token)
	if !errors.Is(err, backend.ErrNotHeld) {
		return err
	}
	if werr := d.drop(ctx, "release", "waiting writer", base+"q", c.Token); werr != nil && !errors.Is(werr, backend.ErrNotHeld) {
		return fmt.Errorf("%w; withdrawing the record of waiting: %w", err, werr)
	}
	return err
}
