package memcachelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the driver's API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
}

// floorValue is what the floor's add stores: a token's length.
var floorValue = []byte("00000000000000000000000000000000")

// rawFloor is add, then delete, of an item named after key (with a suffix
// no lock item has): the two round trips any acquire+release costs at
// least. They go where a lock's cycle goes: on the driver's own
// connections (probes) where it has them and one is free, else on the
// client's. memcached serves each connection on one of its threads, and
// a floor on another connection than the lock's measured, on this
// machine, 1.1x or 3x the same cycle by where the two connections
// landed. A failed delete's item expires within 2s.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	ctx, done, err := d.begin(ctx, "floor")
	if err != nil {
		return err
	}
	defer done()
	k := lockKey(key) + ":floor"
	if addr := d.pipeAddr(k, k); addr != nil {
		lines, _, err := d.pipe(addr, 0, false, appendAdd(nil, k, 2, floorValue), 1)
		switch {
		case errors.Is(err, errBusy): // every probe in use: as a lock, on the client's
		case err == nil && lines[0] != "STORED":
			return fmt.Errorf("memcachelock: floor: add: %w", storeReply(lines[0]))
		case err != nil:
			return fmt.Errorf("memcachelock: floor: add: %w", err)
		default:
			lines, _, err = d.pipe(addr, 0, true, fmt.Appendf(nil, "delete %s\r\n", k), 1)
			if err == nil && lines[0] != "DELETED" {
				err = fmt.Errorf("unexpected reply %q", lines[0])
			}
			if err != nil {
				return fmt.Errorf("memcachelock: floor: delete: %w", err)
			}
			return nil
		}
	}
	if err := d.call(func() error { return d.mc.Add(&memcache.Item{Key: k, Value: floorValue, Expiration: 2}) }); err != nil {
		return fmt.Errorf("memcachelock: floor: add: %w", err)
	}
	if err := d.call(func() error { return d.mc.Delete(k) }); err != nil {
		return fmt.Errorf("memcachelock: floor: delete: %w", err)
	}
	return nil
}
