package memcachelock

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// drawFence is nextFence for the lock item lk, which it also reads after
// the draw, for the confirmation (see nextFence): when the counter and
// the item live on the same server (always, with one server) and the
// driver knows the server list, both go in one write on a probe
// connection (restart.go), which memcached runs in order: incr then gets,
// or, for a missing counter, the seed's add then gets. That saves the
// confirmation's separate gets. read says whether cur is that read (cur
// nil: the item is gone); if not, the caller reads the item itself.
func (d *Driver) drawFence(lk, fk string, ttl time.Duration) (fence uint64, cur *memcache.Item, read bool, err error) {
	if d.servers == nil {
		fence, err = d.nextFenceAt(fk, ttl)
		return fence, nil, false, err
	}
	addr, err := d.servers.PickServer(fk)
	if err != nil {
		return 0, nil, false, fmt.Errorf("memcachelock: %w", err)
	}
	if la, err := d.servers.PickServer(lk); err != nil || la.String() != addr.String() {
		fence, err = d.nextFenceAt(fk, ttl)
		return fence, nil, false, err
	}
	for range maxAttempts {
		line, cur, err := d.exchange(addr, 0, "incr "+fk+" 1\r\n", lk)
		if err != nil {
			return 0, nil, false, err
		}
		if line != "NOT_FOUND" {
			n, err := strconv.ParseUint(line, 10, 64)
			if err != nil {
				return 0, nil, false, fmt.Errorf("memcachelock: fence: incr: unexpected reply %q", line)
			}
			return n, cur, true, nil
		}
		now := uint64(time.Now().UnixMicro())
		line, cur, err = d.exchange(addr, d.checkTTL(ttl), seedCmd(fk, strconv.FormatUint(now, 10), d.fenceExp), lk)
		if err != nil {
			return 0, nil, false, err
		}
		stored, err := seeded(line)
		if err != nil {
			return 0, nil, false, err
		}
		if stored {
			return now, cur, true, nil // see nextFenceAt
		}
	}
	return 0, nil, false, errors.New("memcachelock: fence: the counter kept disappearing")
}
