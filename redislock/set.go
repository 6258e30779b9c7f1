package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

var acquireAllScript = redis.NewScript(lua("value", "fence", "acquire_all"))

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
	delay := d.dep.restartDelay(px)
	keys := make([]string, 0, 2*len(claims))
	values := make([]string, len(claims))
	args := []any{px, delay, d.dep.retention, claims[0].Owner}
	for i, l := range claims {
		k := keysFor(l.Key)
		keys = append(keys, k.lock, k.fence)
		values[i] = attempt(l)
		args = append(args, values[i])
	}
	stop := d.dep.in.watch(ctx).stop
	fences, err := acquireAllScript.Run(ctx, d.dep.rdb, keys, args...).Int64Slice()
	stop()
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

// ReleaseAll implements backend.SetAcquirer: the release scripts in one
// pipeline; a claim whose answer did not come is released alone.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	cmds := make([]*redis.Cmd, len(claims))
	if d.oneServer(claims) {
		if ctx, done, err := d.gate.Enter(ctx); err == nil {
			stop := d.dep.in.watch(ctx).stop
			_, _ = d.dep.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, l := range claims {
					ks, channel := handoffKeys(l.Key)
					cmds[i] = handoffReleaseScript.EvalSha(ctx, p, ks, holder(l), channel, "0", d.dep.retention)
				}
				return nil
			})
			stop()
			done()
		}
	}
	for i, l := range claims {
		if cmds[i] == nil || cmds[i].Err() != nil {
			errs[i] = d.Release(ctx, l) // NOSCRIPT (a restarted server) included
		} else {
			errs[i] = heldErr(d.dep.handedOff(l, cmds[i].Val()))
		}
	}
	return errs
}
