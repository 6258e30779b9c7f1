package redislock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Refreshing in batches: a pipeline (a Quorum's, per server) per batch.

// refreshMany runs the refresh script of each of locks, for px(TTL) ms,
// in one pipeline.
func (dep *deployment) refreshMany(ctx context.Context, locks []backend.Claim, px func(time.Duration) int64) []result {
	res := make([]result, len(locks))
	if len(locks) == 0 {
		return res
	}
	defer dep.in.CutOnEnd(ctx).Stop()
	cmds := dep.pipelined(ctx, len(locks), func(i int) (*script, []string, []any) {
		l := locks[i]
		if l.Mode != backend.Exclusive {
			return sharedRefreshScript, sharedKeys(l), []any{l.Token, px(l.TTL)}
		}
		return refreshScript, []string{keysFor(l.Key).lock}, []any{holder(l), px(l.TTL)}
	})
	for i, c := range cmds {
		v, err := c.Int64()
		res[i] = result{ok: err == nil && v == 1, err: classify(err)}
	}
	return res
}

// pipelined sends the scripts that call(i) names in one pipeline as
// EVALSHA, and those answered NOSCRIPT (an emptied script cache) again as
// EVAL, in a second, as Script.Run does for one.
func (dep *deployment) pipelined(ctx context.Context, n int, call func(i int) (*script, []string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	send := func(eval bool) {
		_, _ = dep.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range cmds {
				switch s, keys, args := call(i); {
				case !eval:
					cmds[i] = s.EvalSha(ctx, p, keys, args...)
				case isNoScript(cmds[i].Err()):
					cmds[i] = s.Eval(ctx, p, keys, args...)
				}
			}
			return nil
		})
	}
	send(false)
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return isNoScript(c.Err()) }) {
		send(true)
	}
	return cmds
}

// RefreshMany implements backend.BatchRefresher: one pipeline per node.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	if len(locks) == 0 {
		return errs
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("redislock: %w", err)
		}
		return errs
	}
	defer done()
	for i, r := range d.dep.refreshMany(ctx, locks, ttlMillis) {
		errs[i] = heldErr(r.ok, r.err)
	}
	return errs
}

// RefreshMany implements backend.BatchRefresher: one pipeline per server,
// in parallel. A lock is refreshed when a majority of the servers
// extended it for the token, and ErrNotHeld when so many show it free or
// another token's that no majority can hold it. It returns once every
// lock is decided, every server answered, or ctx ended.
func (q *Quorum) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	if len(locks) == 0 {
		return errs
	}
	if q.gate.Closed() {
		for i := range errs {
			errs[i] = fmt.Errorf("redislock: quorum: refresh: %w", backend.ErrClosed)
		}
		return errs
	}
	ls := make([]backend.Claim, len(locks))
	var timeout time.Duration
	for i, l := range locks {
		l.TTL = max(l.TTL, minQuorumTTL)
		// A batch waits as long as the longest TTL in it would.
		ls[i], timeout = l, max(timeout, l.TTL)
	}
	t0 := time.Now()
	// One pipeline per server; lock i's results are res[i*nd:(i+1)*nd].
	nd := len(q.deps)
	res := make([]result, len(ls)*nd)
	undecided := len(ls)
	started := fanOut(q, ctx, timeout, false, func(ctx context.Context, i int) []result {
		return q.deps[i].refreshMany(ctx, ls, q.px)
	}, func(i int, rs []result) bool {
		for j, r := range rs {
			mine := res[j*nd : (j+1)*nd]
			was := q.decidedBy(count(mine))
			r.answered = true
			mine[i] = r
			if !was && q.decidedBy(count(mine)) {
				undecided--
			}
		}
		return undecided == 0
	}, nil)
	if !started {
		res = closedResults(len(res))
	}
	for i, l := range ls {
		errs[i] = q.verdict(ctx, "refresh", res[i*nd:(i+1)*nd], t0, l.TTL)
	}
	return errs
}
