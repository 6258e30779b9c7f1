package memcachelock

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// drawFence is nextFence for the lock item lk, which it also reads after
// the draw, for the confirmation (see nextFence): when the counter and
// the item live on the same server (always, with one server) and the
// driver knows the server list, both go in one write on a probe
// connection (restart.go), if one is free, which memcached runs in order: incr then gets,
// or, for a missing counter, the seed's add then gets. That saves the
// confirmation's separate gets. addr is the server when cur is that read
// (cur nil: the item is gone), nil when the caller must read the item
// itself.
func (d *Driver) drawFence(lk, fk string, ttl time.Duration) (fence uint64, cur *memcache.Item, addr net.Addr, err error) {
	if d.servers == nil {
		fence, err = d.nextFence(fk, ttl)
		return fence, nil, nil, err
	}
	addr, err = d.servers.PickServer(fk)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("memcachelock: %w", err)
	}
	if la, err := d.servers.PickServer(lk); err != nil || la.String() != addr.String() {
		fence, err = d.nextFence(fk, ttl)
		return fence, nil, nil, err
	}
	for range maxAttempts {
		line, cur, err := d.exchange(addr, 0, "incr "+fk+" 1\r\n", lk, false)
		if errors.Is(err, errBusy) {
			fence, err = d.nextFence(fk, ttl)
			return fence, nil, nil, err
		}
		if err != nil {
			return 0, nil, nil, fenceErr("incr", err)
		}
		if line != "NOT_FOUND" {
			n, err := strconv.ParseUint(line, 10, 64)
			if err != nil {
				return 0, nil, nil, fmt.Errorf("memcachelock: fence: incr: unexpected reply %q", line)
			}
			return n, cur, addr, nil
		}
		seed, stored, cur, err := d.seed(fk, lk, ttl)
		if err != nil {
			return 0, nil, nil, err
		}
		if stored {
			return seed, cur, addr, nil // see nextFence
		}
	}
	return 0, nil, nil, errors.New("memcachelock: fence: the counter kept disappearing")
}

// casRead is cas for the lock item it, held by l's token, sent on a
// connection to addr with a gets of it in the same write: if the cas
// stored it and the gets finds it still ours, the item as read (its new
// cas id) is kept for Release (heldItems) until then (zero: not kept).
func (d *Driver) casRead(addr net.Addr, it *memcache.Item, l backend.Claim, until time.Time) error {
	cmd := appendCas(nil, it.Key, it.Flags, it.Expiration, it.Value, it.CasID)
	line, cur, err := d.exchange(addr, 0, string(cmd), it.Key, false)
	if errors.Is(err, errBusy) {
		return d.cas(it)
	}
	if err != nil {
		return err
	}
	switch line {
	case "STORED":
		if cur != nil && heldBy(cur.Value, l.Token) && !until.IsZero() {
			d.held.keep(l.Key, l.Token, cur.CasID, cur.Value, until)
		}
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
