package memcachelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// drawFence draws the fencing token from the counter fk: incr, or, when it
// is missing, seed. Fences increase from holder to holder because each is
// drawn while the holder's item exists, as the confirmation checks; the seed
// (the clock in µs) keeps them increasing across a lost counter while clocks
// do not step back (docs/backends/memcachelock.md, "Why fences increase").
// A lock item lk ("" for none) is also read after the draw for the
// confirmation, in the same write (incr or the seed's add, then gets), where
// pipeAddr allows and a probe is free. addr is the server when cur is that
// read (cur nil: the item is gone), nil when it read nothing.
func (d *Driver) drawFence(lk, fk string, ttl time.Duration) (fence uint64, cur *memcache.Item, addr net.Addr, err error) {
	if lk != "" {
		addr = d.pipeAddr(lk, fk)
	}
	for range maxAttempts {
		if addr == nil {
			fence, err = d.incr(context.Background(), fk)
		} else {
			lines, items, perr := d.pipe(addr, 0, false, []byte("incr "+fk+" 1\r\n"), 1, lk)
			switch {
			case errors.Is(perr, errBusy):
				addr, lk = nil, ""
				fence, err = d.incr(context.Background(), fk)
			case perr != nil:
				err = perr
			case lines[0] == "NOT_FOUND":
				err = memcache.ErrCacheMiss
			default:
				if fence, err = strconv.ParseUint(lines[0], 10, 64); err != nil {
					return 0, nil, nil, fmt.Errorf("memcachelock: fence: incr: unexpected reply %q", lines[0])
				}
				cur = items[lk]
			}
		}
		switch {
		case err == nil:
			return fence, cur, addr, nil
		case !errors.Is(err, memcache.ErrCacheMiss):
			return 0, nil, nil, fmt.Errorf("memcachelock: fence: incr: %w", err)
		}
		seed, stored, cur, err := d.seed(fk, lk, ttl)
		if err != nil {
			return 0, nil, nil, err
		}
		if stored {
			// Our add created the counter: the seed is our fence, the
			// counter's first value (every later incr returns more).
			return seed, cur, addr, nil
		}
		// A concurrent seeder's add won: incr again.
	}
	return 0, nil, nil, errors.New("memcachelock: fence: the counter kept disappearing")
}

// shows reports whether the fence counter, as read (nil: missing), holds fence.
func shows(counter *memcache.Item, fence uint64) bool {
	var buf [20]byte
	return counter != nil && bytes.Equal(counter.Value, strconv.AppendUint(buf[:0], fence, 10))
}

// casRead is cas for the lock item it, held by l's token, with a gets of it
// in the same write to addr: the item as read (its new cas id), still ours,
// is kept for Release (heldItems) until then (zero: not kept).
func (d *Driver) casRead(ctx context.Context, addr net.Addr, it *memcache.Item, l backend.Claim, until time.Time) error {
	cmd := appendCas(nil, it.Key, it.Flags, it.Expiration, it.Value, it.CasID)
	lines, items, err := d.pipe(addr, 0, false, cmd, 1, it.Key)
	if errors.Is(err, errBusy) {
		return d.cas(ctx, it)
	}
	if err != nil {
		return err
	}
	if cur := items[it.Key]; lines[0] == "STORED" && cur != nil && heldBy(cur.Value, l.Token) && !until.IsZero() {
		d.held.keep(l.Key, l.Token, cur.CasID, cur.Value, until)
	}
	return storeReply(lines[0])
}

// storeReply is the error of a storage command's reply line.
func storeReply(line string) error {
	switch line {
	case "STORED":
		return nil
	case "EXISTS":
		return memcache.ErrCASConflict
	case "NOT_FOUND":
		return memcache.ErrCacheMiss
	case "NOT_STORED":
		return memcache.ErrNotStored
	}
	return fmt.Errorf("unexpected reply %q", line)
}

// pipeAddr is the server of the lock item lk and its counter fk when both
// live on it (always, with one server) and the driver knows the server list,
// so that requests on both can go in one write; else nil.
func (d *Driver) pipeAddr(lk, fk string) net.Addr {
	if d.servers == nil {
		return nil
	}
	addr, err := d.servers.PickServer(fk)
	if err != nil {
		return nil
	}
	if la, err := d.servers.PickServer(lk); err != nil || la.String() != addr.String() {
		return nil
	}
	return addr
}

// draws are fences drawn at release, with its cas (freeLock), for this
// driver's next acquisition of the key, which adds its item with the fence
// in it and reads the counter back in the same write (tryPiped): unchanged,
// nobody drew one in between, so the fence is above every earlier grant's.
// See docs/backends/memcachelock.md, "Acquiring in one round trip".
type draws struct {
	mu sync.Mutex
	m  map[string]uint64
}

// maxDraws bounds the keys whose drawn fence a driver remembers: past it,
// it forgets them all.
const maxDraws = 1 << 12

func (w *draws) put(key string, fence uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil || len(w.m) >= maxDraws {
		w.m = map[string]uint64{}
	}
	w.m[key] = fence
}

// take returns and forgets the fence drawn for key, if any.
func (w *draws) take(key string) (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f, ok := w.m[key]
	delete(w.m, key)
	return f, ok
}

// peek returns the fence drawn for key, 0 if none.
func (w *draws) peek(key string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m[key]
}

// freeLock replaces the lock item cur of key, if unchanged since it was
// read, with the tombstone (see Release), and draws the fence of our next
// acquisition of key (draws), in the same write where pipeAddr allows. The
// incr also shows pollers that a hold came and went, which an acquisition
// with a drawn fence does not.
func (d *Driver) freeLock(ctx context.Context, key string, cur *memcache.Item) error {
	it := tombstoneOf(cur)
	fk := it.Key + fenceSuffix // fenceKey(key)
	addr := d.pipeAddr(it.Key, fk)
	if addr == nil {
		return d.cas(ctx, it)
	}
	cmd := appendCas(make([]byte, 0, 64+2*len(it.Key)), it.Key, 0, it.Expiration, it.Value, it.CasID)
	cmd = append(append(append(cmd, "incr "...), fk...), " 1\r\n"...)
	lines, _, err := d.pipe(addr, 0, false, cmd, 2)
	if errors.Is(err, errBusy) {
		// gomemcache's connections: the incr still goes (see above).
		if err := d.cas(ctx, it); err != nil {
			return err
		}
		if f, err := d.incr(ctx, fk); err == nil {
			d.draws.put(key, f)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if f, err := strconv.ParseUint(lines[1], 10, 64); err == nil {
		d.draws.put(key, f) // drawn whatever the cas did
	}
	return storeReply(lines[0])
}
