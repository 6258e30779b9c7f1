package memcachelock

import (
	"context"
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
// no lock item has) on the driver's client: the two round trips any
// acquire+release costs at least. A failed delete's item expires within 2s.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	ctx, done, err := d.begin(ctx, "floor")
	if err != nil {
		return err
	}
	defer done()
	k := lockKey(key) + ":floor"
	if err := d.call(func() error { return d.mc.Add(&memcache.Item{Key: k, Value: floorValue, Expiration: 2}) }); err != nil {
		return fmt.Errorf("memcachelock: floor: add: %w", err)
	}
	if err := d.call(func() error { return d.mc.Delete(k) }); err != nil {
		return fmt.Errorf("memcachelock: floor: delete: %w", err)
	}
	return nil
}
