package redislock

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
)

// deployment is one Redis deployment reached through one go-redis client:
// a server, a Redis Cluster or a ring, which answers for every key on its
// own (not "node" nor "server": it may be a cluster; not "store": for a
// Quorum, that is all its members). It runs the scripts, checks
// maxmemory-policy and holds the release subscriptions. A Driver uses one;
// a Quorum one per member, and decides by majority.
type deployment struct {
	rdb  redis.UniversalClient
	ring bool // *redis.Ring: subscriptions must be routed per channel
	// up proves the server's uptime (upproof.go); nil but on a *redis.Client.
	up     *uptime
	log    *slog.Logger
	linger time.Duration
	// restartMax caps restartDelay; < 0: no cap.
	restartMax time.Duration
	// retention is WithRetention's, in milliseconds; retentionArg, the
	// same boxed once for the scripts' arguments.
	retention    int64
	retentionArg any
	// publishDenied warns once of a refused wake-up (see released).
	publishDenied sync.Once
	// in cuts calls on a dead connection short, on a client we dialed,
	// which Close closes; nil for a caller's client.
	in      *conntrack.Tracker
	unroute func() // takes log off go-redis's messages (see routeLogs)

	ctx    context.Context // ended by close: interrupts background cleanups
	cancel context.CancelFunc

	closeOnce sync.Once

	mu     sync.Mutex
	closed bool
	hubs   map[string]*hub       // by route: "" for a client or cluster, the channel for a ring
	marks  map[string]*watchMark // watched keys' marks, by {E}:live (notify.go)
	seq    uint64                // last barrier PING payload sent, on any hub
	wg     sync.WaitGroup        // hub goroutines, linger timers, the maxmemory check
}

func newDeployment(rdb redis.UniversalClient, in *conntrack.Tracker, cfg *config) *deployment {
	_, ring := rdb.(*redis.Ring)
	var up *uptime
	if _, one := rdb.(*redis.Client); one {
		up = &uptime{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	retention := ttlMillis(cfg.retention)
	return &deployment{
		rdb:          rdb,
		in:           in,
		ring:         ring,
		up:           up,
		log:          cfg.logger,
		linger:       cfg.linger,
		restartMax:   cfg.restartDelay,
		retention:    retention,
		retentionArg: retention,
		ctx:          ctx,
		cancel:       cancel,
		hubs:         map[string]*hub{},
		marks:        map[string]*watchMark{},
		unroute:      routeLogs(cfg.logger),
	}
}

// cleanupWait is how long a cancelled call waits for its cleanup (undo):
// a server that answers does so within a round trip.
const cleanupWait = 50 * time.Millisecond

// undo runs f, the cleanup after a failed call, for the caller until f
// returns or ctx ends, and cleanupWait more: a caller who gave up gets its
// answer within that, as backend.Driver requires. The rest goes on in the
// background (f bounds itself by cleanupTimeout); close interrupts it and
// waits for it (on a caller's client, up to its ReadTimeout).
func (dep *deployment) undo(ctx context.Context, f func(context.Context)) {
	done := make(chan struct{})
	bg := context.WithoutCancel(ctx)
	dep.mu.Lock()
	if dep.closed {
		dep.mu.Unlock()
		ctx, cancel := context.WithTimeout(bg, cleanupWait)
		defer cancel()
		f(ctx)
		return
	}
	dep.wg.Go(func() {
		defer close(done)
		// f ignores cancellation, but close cuts a read it is stuck on.
		defer dep.in.CutOnEnd(dep.ctx).Stop()
		f(bg)
	})
	dep.mu.Unlock()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// checkMaxmemory warns when a server may evict keys: an evicted lock key is
// a silently lost lock. A server that refuses CONFIG is not an error.
func (dep *deployment) checkMaxmemory(ctx context.Context, what string) {
	_ = dep.eachServer(ctx, func(ctx context.Context, c *redis.Client) error {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			dep.log.Debug("redislock: cannot read maxmemory-policy", "server", what, "err", err)
		} else if p, ok := m["maxmemory-policy"]; ok && p != "noeviction" {
			dep.log.Warn("redislock: maxmemory-policy is not noeviction: an evicted lock key is a silently lost lock; set maxmemory-policy noeviction",
				"server", what, "maxmemory-policy", p)
		}
		return nil
	})
}

// eachServer calls f for each server that holds keys: every master of a
// cluster or shard of a ring (concurrently), or the one server.
func (dep *deployment) eachServer(ctx context.Context, f func(context.Context, *redis.Client) error) error {
	switch c := dep.rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, f)
	case *redis.Ring:
		return c.ForEachShard(ctx, f)
	case *redis.Client:
		return f(ctx, c)
	}
	return fmt.Errorf("%w: cannot enumerate the servers of a %T", backend.ErrUnsupported, dep.rdb)
}

// checkMaxmemoryAsync is checkMaxmemory in the background; close stops it.
func (dep *deployment) checkMaxmemoryAsync(what string) {
	ctx, cancel := context.WithTimeout(dep.ctx, 5*time.Second)
	dep.wg.Go(func() {
		defer cancel()
		dep.checkMaxmemory(ctx, what)
	})
}

// close stops the goroutines and subscriptions, and closes a client we dialed.
func (dep *deployment) close() error {
	dep.mu.Lock()
	if dep.closed {
		dep.mu.Unlock()
		return nil
	}
	dep.closed = true
	hubs := slices.Collect(maps.Values(dep.hubs))
	for _, h := range hubs {
		h.kill()
		for _, st := range h.chans {
			if st.idle != nil && st.idle.Stop() {
				dep.wg.Done()
			}
			st.idle = nil
		}
	}
	dep.hubs = map[string]*hub{}
	dep.mu.Unlock()
	dep.unroute()
	dep.cancel()
	for _, h := range hubs {
		_ = h.ps.Close()
		h.endBarriers(math.MaxUint64, backend.ErrClosed)
	}
	dep.wg.Wait()
	return dep.closeClient()
}

// closeClient closes the client if this package dialed it, once.
func (dep *deployment) closeClient() error {
	var err error
	if dep.in != nil {
		dep.closeOnce.Do(func() { err = dep.rdb.Close() })
	}
	return err
}
