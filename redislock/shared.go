package redislock

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Semaphores and read-write locks (backend.Modal): each is an object of its
// own next to the name's lock, in the same hash slot, with its own fence
// counter (see scripts/shared.lua).

var (
	//go:embed scripts/shared.lua
	sharedLua string
	//go:embed scripts/shared_acquire.lua
	sharedAcquireLua string
	//go:embed scripts/shared_refresh.lua
	sharedRefreshLua string
	//go:embed scripts/shared_release.lua
	sharedReleaseLua string

	sharedAcquireScript = redis.NewScript(sharedLua + sharedAcquireLua)
	sharedRefreshScript = redis.NewScript(sharedLua + sharedRefreshLua)
	sharedReleaseScript = redis.NewScript(sharedLua + sharedReleaseLua)
)

var _ backend.Modal = (*Driver)(nil)

// Modes implements backend.Modal: semaphores and read-write locks, on a
// server, a Redis Cluster or a ring. A FairDriver and a Quorum take none
// (see their Modes).
func (d *Driver) Modes() backend.ModeSet {
	if d.fair {
		return 0
	}
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Modes implements backend.Modal: none. The fair queue orders a lock's
// waiters; it has no order for permits, readers and writers, and a plain
// TryAcquire of a permit would ignore the queue.
func (d *FairDriver) Modes() backend.ModeSet { return 0 }

// Modes implements backend.Modal: none. Each server of a quorum would
// grant up to the limit to different clients, so a majority bounds
// nothing: n permits on each of three servers of five let 5n/3 clients
// each gather a majority.
func (q *Quorum) Modes() backend.ModeSet { return 0 }

// sharedKeys returns the Redis names of c's object: holders, state and
// fence counter (see scripts/shared.lua), in the name's hash slot.
func sharedKeys(c backend.Claim) []string {
	kind := ":sem"
	if c.Mode != backend.Permit {
		kind = ":rw"
	}
	p := "{" + backend.EscapeKey(c.Key) + "}" + kind
	return []string{p, p + ".h", p + ".fence"}
}

// sharedMode is the acquire script's name for c's mode.
func sharedMode(c backend.Claim) string {
	switch c.Mode {
	case backend.Permit:
		return "p"
	case backend.Read:
		return "r"
	}
	return "w"
}

// tryShared is TryAcquire for a permit, a read or a write.
func (d *Driver) tryShared(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	if c.Mode > backend.Write || d.fair {
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w: %s mode", backend.ErrUnsupported, c.Mode)
	}
	if c.Mode == backend.Permit && (c.Limit < 1 || c.Limit > backend.MaxLimit) {
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w: %d", backend.ErrInvalidLimit, c.Limit)
	}
	px := ttlMillis(c.TTL)
	n := attempts.Add(1)
	dep := d.dep
	r, err := func() (any, error) {
		defer dep.in.watch(ctx).stop()
		return sharedAcquireScript.Run(ctx, dep.rdb, sharedKeys(c), sharedMode(c), c.Token, n, px, c.Limit, dep.restartDelay(px), dep.retention).Result()
	}()
	if err != nil {
		// The script may have run although we never saw its answer.
		dep.undo(ctx, func(ctx context.Context) { dep.cleanupShared(ctx, c, n) })
		return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w", classify(err))
	}
	switch v := r.(type) {
	case int64:
		if v <= 0 {
			return backend.Grant{}, notAcquired("try-acquire", v)
		}
		return backend.Grant{Fence: uint64(v), TTL: time.Duration(px) * time.Millisecond}, nil
	case string:
		if held, ok := strings.CutPrefix(v, "limit:"); ok {
			return backend.Grant{}, fmt.Errorf("redislock: try-acquire: %w: held under %s, asked with %d", backend.ErrLimitMismatch, held, c.Limit)
		}
	}
	return backend.Grant{}, fmt.Errorf("redislock: try-acquire: unexpected answer %v", r)
}

// refreshShared is Refresh for a permit, a read or a write.
func (dep *deployment) refreshShared(ctx context.Context, c backend.Claim, px int64) (bool, error) {
	defer dep.in.watch(ctx).stop()
	v, err := sharedRefreshScript.Run(ctx, dep.rdb, sharedKeys(c), c.Token, px).Int64()
	return v == 1, classify(err)
}

// releaseShared is Release for a permit, a read or a write; a writer that
// does not hold withdraws its record of waiting.
func (dep *deployment) releaseShared(ctx context.Context, c backend.Claim) (bool, error) {
	defer dep.in.watch(ctx).stop()
	v, err := sharedReleaseScript.Run(ctx, dep.rdb, sharedKeys(c), c.Token, keysFor(c.Key).channel, "").Int64()
	return dep.released(v), classify(err)
}

// cleanupShared removes what the failed attempt n of c may have left, as
// cleanup does for a lock: only that attempt's hold.
func (dep *deployment) cleanupShared(ctx context.Context, c backend.Claim, n uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.watch(ctx).stop()
	_ = sharedReleaseScript.Eval(ctx, dep.rdb, sharedKeys(c), c.Token, keysFor(c.Key).channel, strconv.FormatUint(n, 10)).Err()
}
