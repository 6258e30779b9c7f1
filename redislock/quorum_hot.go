package redislock

import (
	"context"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Contended names: on a name refused lately, an attempt asks the name's
// arbiter first, so that simultaneous attempts do not split the vote, and
// a releaser yields the name to others' waiters for yieldFor. Ordering
// only: a lock is held only when a majority granted it.

// hotFor is how long a name stays hot after a refusal.
const hotFor = time.Second

// yieldFor is how long a releaser waits before trying a name others want.
const yieldFor = 2 * time.Millisecond

// arbiterGrace is how long a Release that a majority answered waits for
// the name's arbiter (see Release): only an unreachable or stalled arbiter
// answers later than a round trip after the others.
const arbiterGrace = 200 * time.Millisecond

// hotKey is what a Quorum knows of a contended name; guarded by q.mu.
type hotKey struct {
	denied   time.Time // last refusal of this Quorum's attempt
	remote   time.Time // last refusal while this Quorum held no grant of it
	released time.Time // this Quorum's last release of it
	held     int       // this Quorum's grants of it not yet released
}

// hotState says whether key is hot, and how long to wait (yieldFor).
func (q *Quorum) hotState(key string, now time.Time) (hot bool, wait time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.hot[key]
	if h == nil || now.Sub(h.denied) > hotFor {
		return false, 0
	}
	if now.Sub(h.remote) < hotFor {
		wait = h.released.Add(yieldFor).Sub(now)
	}
	return true, max(wait, 0)
}

// noteDenied records a refusal of an attempt on key.
func (q *Quorum) noteDenied(key string, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.hot[key]
	if h == nil {
		q.pruneHot(now)
		h = &hotKey{}
		q.hot[key] = h
	}
	h.denied = now
	if h.held == 0 {
		h.remote = now
	}
}

// noteGranted and noteReleased count this Quorum's grants of a hot key.
func (q *Quorum) noteGranted(key string) {
	q.mu.Lock()
	if h := q.hot[key]; h != nil {
		h.held++
	}
	q.mu.Unlock()
}

func (q *Quorum) noteReleased(key string, now time.Time) {
	q.mu.Lock()
	if h := q.hot[key]; h != nil {
		h.held = max(h.held-1, 0)
		h.released = now
	}
	q.mu.Unlock()
}

// pruneHot drops cooled names as the map grows; q.mu is held.
func (q *Quorum) pruneHot(now time.Time) {
	if len(q.hot) < q.hotPrune {
		return
	}
	for k, h := range q.hot {
		// A grant lost and never released must not keep a name forever.
		if now.Sub(h.denied) > hotFor {
			delete(q.hot, k)
		}
	}
	q.hotPrune = max(64, 2*len(q.hot))
}

// arbiter is the server a hot key's attempts ask first.
func (q *Quorum) arbiter(key string) int {
	return backend.OneOf(key, len(q.deps))
}

// tryArbiter asks key's arbiter alone: granted, the attempt goes on with
// its answer (pre); refused, it ends with nothing to undo. An error leaves
// it to a full round, which cleans up after the arbiter.
func (q *Quorum) tryArbiter(ctx context.Context, l backend.Claim, keys []string, value string, px int64) (pre *result, refused bool) {
	a := q.arbiter(l.Key)
	closing, done, ok := q.gate.Background()
	if !ok {
		return nil, false
	}
	defer done()
	rctx, cancel := context.WithTimeout(ctx, time.Duration(px)*time.Millisecond)
	defer cancel()
	defer context.AfterFunc(closing, cancel)()
	f, err := q.acquireOn(rctx, a, l, keys, value, px)
	switch {
	case err != nil:
		return nil, false
	case f <= 0:
		return nil, true
	}
	return &result{ok: true, fence: uint64(f)}, false
}
