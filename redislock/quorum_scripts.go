package redislock

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// quorumPrefix declares the acquire script's settings, from ARGV[4..7]:
// acquire.lua's, and the clock floor's grain (see fence.lua).
const quorumPrefix = "local restart_delay, retention, owner = tonumber(ARGV[4]), ARGV[5], ARGV[6]\nfence_grain = tonumber(ARGV[7])\n"

// quorumAcquireScript is the plain quorum acquire script.
var quorumAcquireScript = redis.NewScript(lua("value", "fence") + quorumPrefix + lua("acquire"))

// grain rounds the clock floor, in µs: a second, or half the retention.
func (dep *deployment) grain() int64 {
	return max(min(1_000_000, dep.retention*1000/2), 1)
}

// acquireOn is acquire on server i; keys are lockKeys', built once.
func (q *Quorum) acquireOn(ctx context.Context, i int, l backend.Claim, keys []string, value string, px int64) (int64, error) {
	dep := q.deps[i]
	delay := dep.restartDelay(px)
	defer dep.in.CutOnEnd(ctx).Stop()
	return dep.up.run(ctx, dep, q.gate.Background, quorumAcquireScript, quorumPrefix, delay, keys, value, px, holder(l), delay, dep.retention, l.Owner, dep.grain())
}

// lockKeys are the acquire script's keys for key.
func lockKeys(key string) []string {
	k := keysFor(key)
	return []string{k.lock, k.fence}
}
