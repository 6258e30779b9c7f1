package redislock

import (
	"context"
	"fmt"
	"strconv"

	"github.com/lockerhq/locker/backend"
)

// The default mode's queue: a release hands a contended lock to the
// longest-waiting live waiter, in the release message (scripts/handoff.lua).

// handedTo returns the fence of a hand-off to attempt, if sub received
// one. Others are dropped: one to an earlier attempt is stale, and a
// later attempt's is taken over by the next try.
func (dep *deployment) handedTo(sub *subscription, attempt uint64) (uint64, bool) {
	if sub == nil {
		return 0, false
	}
	dep.mu.Lock()
	defer dep.mu.Unlock()
	for _, h := range sub.handed {
		if h.attempt == attempt && attempt != 0 {
			return h.fence, true
		}
	}
	sub.handed = sub.handed[:0]
	return 0, false
}

// handoffKeys returns the default mode scripts' keys, and the channel.
func handoffKeys(key string) ([]string, string) {
	k := keysFor(key)
	return []string{k.lock, k.fence, k.queue, k.live, k.hand}, k.channel
}

// handoffRelease is release that hands the lock to the first live waiter;
// a waiter of this process learns it from the reply, ahead of pub/sub.
func (dep *deployment) handoffRelease(ctx context.Context, l backend.Claim) (bool, error) {
	ks, channel := handoffKeys(l.Key)
	r, err := dep.run(ctx, handoffReleaseScript, ks, holder(l), channel, "0", dep.retention).Result()
	if err != nil {
		return false, classify(err)
	}
	switch r := r.(type) {
	case int64:
		return dep.released(r), nil
	case []any:
		if len(r) == 2 {
			code, _ := r[0].(int64)
			msg, _ := r[1].(string)
			dep.handLocal(l.Key, msg)
			return dep.released(code), nil
		}
	}
	return false, fmt.Errorf("unexpected answer %v", r)
}

// handLocal delivers hand-off message msg to its waiter if it waits in
// this process, ahead of the hub (whose second delivery handedTo ignores).
func (dep *deployment) handLocal(key, msg string) {
	to, h, ok := parseHandoff(msg)
	if !ok {
		return
	}
	channel := keysFor(key).channel
	dep.mu.Lock()
	defer dep.mu.Unlock()
	if hb := dep.hubs[dep.route(channel)]; hb != nil {
		if st := hb.chans[channel]; st != nil {
			for s := range st.subs {
				if s.id == to {
					s.addHanded(h)
					backend.Notify(s.ch)
					break
				}
			}
		}
	}
}

// handoffCleanup is cleanup for the default mode: a lock taken is handed on.
func (dep *deployment) handoffCleanup(ctx context.Context, l backend.Claim, value string) {
	ks, channel := handoffKeys(l.Key)
	_ = dep.evalCleanup(ctx, handoffReleaseScript, ks, value, channel, "1", dep.retention)
}

// handoffLeave takes waiter w out of l.Key's queue and hands on the lock
// if an attempt of the wait (from first on) holds it. Best effort: a
// waiter that could not leave is skipped once its liveness runs out.
func (dep *deployment) handoffLeave(ctx context.Context, l backend.Claim, first uint64, w string) error {
	ks, channel := handoffKeys(l.Key)
	return dep.evalCleanup(ctx, handoffLeaveScript, ks, holder(l), strconv.FormatUint(first, 10), channel, w, dep.retention)
}
