package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the drivers' API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
	measure.RegisterRawFloor((*FairDriver).rawFloor)
	measure.RegisterRawFloor((*Quorum).rawFloor)
	measure.RegisterStoreTries(func(d *Driver) uint64 { return d.tries.Load() })
	measure.RegisterStoreTries(func(d *FairDriver) uint64 { return d.tries.Load() })
}

// rawRelease is the floors' compare-and-delete (floor.go, quorum_floor.go).
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// rawFloor is a bare SET key NX PX and a compare-and-delete script
// (EVALSHA) on the Driver's client, what any Redis lock's acquire and
// release cost at least.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	const token = "raw-floor"
	ok, err := d.dep.rdb.SetNX(ctx, key, token, 30*time.Second).Result()
	if err != nil {
		return fmt.Errorf("redislock: raw floor: %w", err)
	}
	if !ok {
		return errors.New("redislock: raw floor: the key is taken")
	}
	n, err := rawRelease.Run(ctx, d.dep.rdb, []string{key}, token).Int64()
	if err != nil {
		return fmt.Errorf("redislock: raw floor: %w", err)
	}
	if n != 1 {
		return errors.New("redislock: raw floor: the key was gone before its delete")
	}
	return nil
}
