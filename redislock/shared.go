package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockerhq/locker/backend"
)

// Semaphores and read-write locks (backend.Modal): see scripts/shared.lua.

var (
	sharedAcquireScript = newScript(lua("fence", "shared", "shared_queue", "shared_acquire"))
	sharedRefreshScript = newScript(lua("shared", "shared_refresh"))
	sharedReleaseScript = newScript(lua("shared", "shared_release"))
	sharedLeaveScript   = newScript(lua("shared", "shared_leave"))
	sharedResizeScript  = newScript(lua("shared_resize"))
)

// Modes implements backend.Modal: semaphores and read-write locks, in
// every deployment; a FairDriver's too. A Quorum takes none.
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Modes implements backend.Modal: none. Each server would grant up to the
// limit to different clients, so a majority bounds nothing.
func (q *Quorum) Modes() backend.ModeSet { return 0 }

// Weighs implements backend.Weigher: grants and waiters carry weights.
func (d *Driver) Weighs() bool { return true }

// sharedKeys are the Redis names of c's holders, state and fence counter.
func sharedKeys(c backend.Claim) []string {
	p := sharedPrefix(c)
	return []string{p, p + ".h", p + ".fence"}
}

// fairSharedKeys is sharedKeys, the object's queue, and a semaphore's
// resize record.
func fairSharedKeys(c backend.Claim) []string {
	p := sharedPrefix(c)
	if c.Mode == backend.Permit {
		return []string{p, p + ".h", p + ".fence", p + ".q", p + ".live", p + ".limit"}
	}
	return []string{p, p + ".h", p + ".fence", p + ".q", p + ".live"}
}

func sharedPrefix(c backend.Claim) string {
	return "{" + backend.EscapeKey(c.Key) + "}" + sharedKind(c.Mode)
}

// sharedKind ends the Redis name of mode m's object.
func sharedKind(m backend.Mode) string {
	if m == backend.Permit {
		return ":sem"
	}
	return ":rw"
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

// checkShared reports a mode or limit the scripts cannot take.
func checkShared(c backend.Claim) error {
	if c.Mode > backend.Write {
		return fmt.Errorf("%w: %s mode", backend.ErrUnsupported, c.Mode)
	}
	if c.Mode == backend.Permit && (c.Limit < 1 || c.Limit > backend.MaxLimit || c.Weight > c.Limit) {
		return fmt.Errorf("%w: %d of %d permits", backend.ErrInvalidLimit, c.Weight, c.Limit)
	}
	return nil
}

// sharedAnswer is the shared acquire script's answer: the number v, or the
// held permits' limit when it differs, or the resize record's (resized).
type sharedAnswer struct {
	v       int64
	limit   string
	resized bool
}

// acquireShared runs the shared acquire script for attempt n of c, as
// waiter w, in mode "try", "wait" or "look" (scripts/shared_queue.lua).
func (dep *deployment) acquireShared(ctx context.Context, c backend.Claim, n uint64, px int64, w, mode string) (sharedAnswer, error) {
	r, err := dep.run(ctx, sharedAcquireScript, fairSharedKeys(c), sharedMode(c), c.Token, n, px, c.Limit, dep.restartDelay(px), dep.retentionArg,
		w, livenessTTL.Milliseconds(), mode, keysFor(c.Key).channel, max(c.Weight, 1), c.Owner).Result()
	if err != nil {
		return sharedAnswer{}, classify(err)
	}
	switch v := r.(type) {
	case int64:
		return sharedAnswer{v: v}, nil
	case string:
		if held, ok := strings.CutPrefix(v, "limit:"); ok {
			return sharedAnswer{limit: held}, nil
		}
		if rec, ok := strings.CutPrefix(v, "resized:"); ok {
			return sharedAnswer{limit: rec, resized: true}, nil
		}
	}
	return sharedAnswer{}, fmt.Errorf("unexpected answer %v", r)
}

func limitMismatch(op string, r sharedAnswer, c backend.Claim) error {
	if r.resized {
		return fmt.Errorf("redislock: %s: %w", op, backend.ResizedTo(max(c.Weight, 1), r.limit))
	}
	return fmt.Errorf("redislock: %s: %w", op, backend.HeldUnder(r.limit, c.Limit))
}

// releaseShared is Release for a permit, a read or a write.
func (dep *deployment) releaseShared(ctx context.Context, c backend.Claim) (bool, error) {
	v, err := dep.run(ctx, sharedReleaseScript, sharedKeys(c), c.Token, keysFor(c.Key).channel, "").Int64()
	return dep.released(v), classify(err)
}

// leaveShared is leave for c's queue, freeing what attempt n was granted.
func (dep *deployment) leaveShared(ctx context.Context, c backend.Claim, n uint64, w string) error {
	return dep.evalCleanup(ctx, sharedLeaveScript, fairSharedKeys(c), c.Token, strconv.FormatUint(n, 10), w, keysFor(c.Key).channel)
}

// cleanupShared is cleanup for attempt n of c.
func (dep *deployment) cleanupShared(ctx context.Context, c backend.Claim, n uint64) {
	_ = dep.evalCleanup(ctx, sharedReleaseScript, sharedKeys(c), c.Token, keysFor(c.Key).channel, strconv.FormatUint(n, 10))
}

// Resize implements backend.Resizer: the limit is a key beside the
// semaphore's, {E}:sem.limit, without expiry, that every permit's
// acquire script reads.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	defer done()
	ks := fairSharedKeys(backend.Claim{Key: key, Mode: backend.Permit})
	v, err := d.dep.run(ctx, sharedResizeScript, []string{ks[1], ks[5]}, strconv.Itoa(limit), keysFor(key).channel).Int64()
	if err != nil {
		return fmt.Errorf("redislock: resize: %w", classify(err))
	}
	d.dep.released(v)
	return nil
}
