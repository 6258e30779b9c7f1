package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

var (
	acquireAllScript = newScript(lua("value", "fence", "acquire_all"))
	releaseAllScript = newScript(lua("release_all"))
)

// oneServer says whether claims can be taken by one script: the default
// mode on one server (a Cluster or Ring spreads the names; fair mode
// queues each).
func (d *Driver) oneServer(claims []backend.Claim) bool {
	if _, single := d.dep.rdb.(*redis.Client); !single || d.fair {
		return false
	}
	for _, l := range claims {
		if l.Mode != backend.Exclusive || l.TTL != claims[0].TTL || l.Owner != claims[0].Owner {
			return false
		}
	}
	return true
}

// TryAcquireAll implements backend.SetAcquirer with one script on one
// server in the default mode; elsewhere it returns ErrUnsupported, and the
// Client takes the set name by name.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	if !d.oneServer(claims) {
		return nil, fmt.Errorf("redislock: try-acquire: a set in one script: %w", backend.ErrUnsupported)
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("redislock: try-acquire: %w", err)
	}
	defer done()
	px := ttlMillis(claims[0].TTL)
	keys := make([]string, 0, 2*len(claims))
	values := make([]string, len(claims))
	args := []any{px, d.dep.restartDelay(px), d.dep.retentionArg, claims[0].Owner}
	for i, l := range claims {
		k := keysFor(l.Key)
		keys = append(keys, k.lock, k.fence)
		values[i] = attempt(l)
		args = append(args, values[i])
	}
	fences, err := d.dep.run(ctx, acquireAllScript, keys, args...).Int64Slice()
	if err != nil {
		// The script may have run although we never saw its answer.
		d.dep.undo(ctx, func(ctx context.Context) {
			for i, l := range claims {
				d.dep.handoffCleanup(ctx, l, values[i])
			}
		})
		return nil, fmt.Errorf("redislock: try-acquire: %w", classify(err))
	}
	if len(fences) != len(claims) || fences[0] <= 0 {
		return nil, notAcquired("try-acquire", fences[0])
	}
	grants := make([]backend.Grant, len(claims))
	for i, f := range fences {
		grants[i] = backend.Grant{Fence: uint64(f), TTL: time.Duration(px) * time.Millisecond}
	}
	return grants, nil
}

// ReleaseAll implements backend.SetAcquirer: on one server in the default
// mode, release_all.lua frees the names nobody waits for in one script;
// each other name (waited for, or the script's answer lost) is released
// alone, as Release would.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	var codes []int64
	if d.oneServer(claims) {
		if ctx, done, err := d.gate.Enter(ctx); err == nil {
			n := len(claims)
			keys := make([]string, 2*n)
			args := make([]any, n)
			for i, l := range claims {
				k := keysFor(l.Key)
				keys[i], keys[n+i] = k.lock, k.live
				args[i] = holder(l)
			}
			codes, _ = d.dep.run(ctx, releaseAllScript, keys, args...).Int64Slice()
			done()
		}
	}
	for i, l := range claims {
		switch {
		case len(codes) != len(claims) || codes[i] < 0:
			errs[i] = d.Release(ctx, l) // NOSCRIPT's fallback and a failure included
		case codes[i] == 0:
			errs[i] = fmt.Errorf("redislock: %w", backend.ErrNotHeld)
		}
	}
	return errs
}
