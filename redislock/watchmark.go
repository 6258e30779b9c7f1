package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// A release publishes a wake-up only when the lock's {E}:live hash exists
// (handoff_release.lua): queued waiters have entries there, and a watcher
// (Subscribe) a field of its own, watchField, renewed while it watches. So
// a release nobody waits for or watches costs no PUBLISH, which a cluster
// sends to every node.

// watchField is the watchers' field of {E}:live (no waiter is named so).
const watchField = "~watch"

// watchEvery renews a mark that lives 2*livenessTTL, as waiters' entries.
const watchEvery = livenessTTL / 2

var watchScript = redis.NewScript(`redis.call('HSET', KEYS[1], ARGV[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// watchMark is one key's mark: its watchers' channels, woken when a renewal
// failed or came late (a release may have gone unpublished).
type watchMark struct {
	chans map[chan struct{}]struct{}
	ok    time.Time // last renewal that succeeded
}

// mark puts key's mark in place until stop, waking ch whenever it may have
// lapsed. The first is written before mark returns, so that no release
// after Subscribe goes unpublished.
func (dep *deployment) mark(ctx context.Context, key string, ch chan struct{}) (stop func(), err error) {
	live := keysFor(key).live
	sent := time.Now()
	if err := dep.writeMark(ctx, live); err != nil {
		return nil, fmt.Errorf("redislock: subscribe: %w", err)
	}
	dep.mu.Lock()
	defer dep.mu.Unlock()
	if dep.closed {
		return nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	m := dep.marks[live]
	if m == nil {
		m = &watchMark{chans: map[chan struct{}]struct{}{}, ok: sent}
		dep.marks[live] = m
		dep.wg.Go(func() { dep.renewMark(live, m) })
	}
	m.chans[ch] = struct{}{}
	return sync.OnceFunc(func() {
		dep.mu.Lock()
		delete(m.chans, ch)
		dep.mu.Unlock()
	}), nil
}

func (dep *deployment) writeMark(ctx context.Context, live string) error {
	return classify(dep.run(ctx, watchScript, []string{live}, watchField, (2 * livenessTTL).Milliseconds()).Err())
}

// renewMark renews m until it has no watchers or dep closes.
func (dep *deployment) renewMark(live string, m *watchMark) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	lapsed := false
	for {
		select {
		case <-dep.ctx.Done():
			return
		case <-t.C:
		}
		dep.mu.Lock()
		if len(m.chans) == 0 {
			delete(dep.marks, live)
			dep.mu.Unlock()
			return
		}
		dep.mu.Unlock()
		sent := time.Now()
		ctx, cancel := context.WithTimeout(dep.ctx, watchEvery)
		err := dep.writeMark(ctx, live)
		cancel()
		dep.mu.Lock()
		// The mark lives 2*livenessTTL from the last write that landed,
		// sent at m.ok or later.
		lapsed = lapsed || err != nil || time.Since(m.ok) >= 2*livenessTTL
		if err == nil {
			m.ok = sent
			if lapsed {
				for ch := range m.chans {
					backend.Notify(ch)
				}
				lapsed = false
			}
		}
		dep.mu.Unlock()
	}
}
