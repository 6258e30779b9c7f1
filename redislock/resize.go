package redislock

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

var sharedResizeScript = redis.NewScript(lua("shared_resize"))

// Resize implements backend.Resizer: the limit is a key beside the
// semaphore's, {E}:sem.limit, without expiry, that every permit's
// acquire script reads.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	defer done()
	dep := d.dep
	ks := fairSharedKeys(backend.Claim{Key: key, Mode: backend.Permit})
	v, err := dep.run(ctx, sharedResizeScript, []string{ks[1], ks[5]}, strconv.Itoa(limit), keysFor(key).channel).Int64()
	if err != nil {
		return fmt.Errorf("redislock: resize: %w", classify(err))
	}
	dep.released(v)
	return nil
}
