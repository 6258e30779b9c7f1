// Package fencedredis guards writes to Redis with a lock's fence (see
// package fenced): a write runs, in one script with the check, only if its
// fence is at least the highest one its resource's fence key has seen.
//
//	_, err := fencedredis.Do(ctx, rdb, "{account:alice}:fence", lock.Fence(), "SET", "{account:alice}:balance", 80)
//	if errors.Is(err, fenced.ErrStale) { ... } // a later holder has written
//
// The fence key and the written key must live on one server: on a Redis
// Cluster give them one hash tag, as above. The fence key has no TTL and
// must be as durable as the data it guards (the same server, the same
// persistence): a fence key lost while its data stays lets a stale write
// in again.
package fencedredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/fenced"
)

// Fences are compared as decimal strings, shorter first: exact for every
// uint64, where Lua's numbers are exact to 2^53 only.
var guarded = redis.NewScript(`
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local seen = redis.call('GET', KEYS[1]) or '0'
if below(ARGV[1], seen) then
  return redis.error_reply('STALE ' .. seen)
end
if below(seen, ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
`)

// Do runs command on key with args (SET key value, HSET key field value,
// ...) if fence is at least the highest fence that fenceKey has seen,
// which fence then becomes, all in one step on the server. It returns the
// command's reply, or an error wrapping fenced.ErrStale when a higher
// fence was seen (the command does not run).
func Do(ctx context.Context, rdb redis.Scripter, fenceKey string, fence uint64, command, key string, args ...any) (any, error) {
	switch {
	case fence == 0:
		return nil, fmt.Errorf("fencedredis: %s: fence 0: the lock's backend issues no fences: %w", key, fenced.ErrInvalid)
	case fenceKey == "" || key == "" || command == "":
		return nil, fmt.Errorf("fencedredis: the fence key, the command and its key are all needed: %w", fenced.ErrInvalid)
	case fenceKey == key:
		return nil, fmt.Errorf("fencedredis: %s: the fence key is the key written: %w", key, fenced.ErrInvalid)
	}
	f := strconv.FormatUint(fence, 10)
	v, err := guarded.Run(ctx, rdb, []string{fenceKey, key}, append([]any{f, command}, args...)...).Result()
	if err != nil {
		if seen, ok := strings.CutPrefix(err.Error(), "STALE "); ok {
			return nil, fmt.Errorf("fencedredis: %s: fence %s is below %s, a later holder's: %w", key, f, seen, fenced.ErrStale)
		}
		if errors.Is(err, redis.Nil) {
			return nil, err
		}
		return nil, fmt.Errorf("fencedredis: %s: %w", key, err)
	}
	return v, nil
}
