package redislock

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// lua returns the scripts/<name>.lua files named, one after the other.
func lua(names ...string) string {
	var b strings.Builder
	for _, name := range names {
		src, err := scriptFiles.ReadFile("scripts/" + name + ".lua")
		if err != nil {
			panic(err) // a name misspelled here: every test fails at init
		}
		b.Write(src)
	}
	return b.String()
}

// acquirePrefix declares the acquire script's settings, from ARGV[4..6];
// queueArgs, the queues' (which run it as a function, for the next waiter).
const acquirePrefix = "local restart_delay, retention, owner = tonumber(ARGV[4]), ARGV[5], ARGV[6]\n"

const queueArgs = "local restart_delay, retention, owner = tonumber(ARGV[7]), ARGV[8], ARGV[9]\nlocal function acquire()\n"

var (
	// script.run sends EVALSHA, and EVAL on NOSCRIPT (an emptied cache).
	acquireScript = newScript(lua("fence") + acquirePrefix + lua("acquire"))
	refreshScript = newScript(lua("refresh"))
	releaseScript = newScript(lua("value") + "local function next_waiter() return '' end\n" + lua("release"))
	raiseScript   = newScript(lua("value", "raise"))
	inspectScript = newScript(lua("queue", "waiters", "inspect"))
	breakScript   = newScript(lua("value") + "local function next_waiter() return '' end\n" + lua("break"))

	// Fair mode's: its acquire grants the head of the queue only.
	fairAcquireScript = newScript(lua("value", "fence", "queue") + queueArgs + lua("acquire") + "\nend\n" + lua("fair_acquire"))
	fairReleaseScript = newScript(lua("value", "queue") + "local function next_waiter() return live_head(KEYS[2], KEYS[3], '') end\n" + lua("release"))
	fairBreakScript   = newScript(lua("value", "queue") + "local function next_waiter() return live_head(KEYS[2], KEYS[3], '') end\n" + lua("break"))
	leaveScript       = newScript(lua("value", "queue", "leave"))

	// The default mode's: a release hands the lock to the first waiter.
	handoffPrefix        = lua("value", "fence", "queue", "handoff")
	handoffAcquireScript = newScript(handoffPrefix + queueArgs + lua("acquire") + "\nend\n" + lua("handoff_acquire"))
	handoffReleaseScript = newScript(lua("handoff_release", "value", "fence", "queue", "handoff", "handoff_queued"))
	handoffLeaveScript   = newScript(handoffPrefix + lua("handoff_leave"))
)

// ttlMillis rounds ttl up to whole milliseconds, PX's unit, at least 1.
func ttlMillis(ttl time.Duration) int64 {
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return max(int64(ms), 1)
}

// attempts numbers the tries of every token, in increasing order: the lock
// key holds "<token>.<attempt>:<fence>:<owner>", so that cleaning up after
// a failed try never removes what a later try set (see scripts/value.lua).
var attempts atomic.Uint64

// attempt returns a lock value for a new try of l.
func attempt(l backend.Claim) string {
	return attemptValue(l.Token, attempts.Add(1))
}

// attemptValue is "<token>.<n>", in one allocation (every try builds one).
func attemptValue(token string, n uint64) string {
	var b strings.Builder
	b.Grow(len(token) + 21)
	b.WriteString(token)
	b.WriteByte('.')
	var digits [20]byte
	b.Write(strconv.AppendUint(digits[:0], n, 10))
	return b.String()
}

func holder(l backend.Claim) string { return l.Token + "." }

// holderOf is holder(l) for a value of l's (see attempt), without a copy.
func holderOf(l backend.Claim, value string) string { return value[:len(l.Token)+1] }

// acquire runs the acquire script for one attempt: the fence; 0 when
// another token holds the lock; -n when the server started less than a TTL
// ago and grants the name in n ms. enter is the Driver's gate, for the
// uptime proof's background work (upproof.go).
func (dep *deployment) acquire(ctx context.Context, enter func() (context.Context, func(), bool), l backend.Claim, value string, px int64) (int64, error) {
	defer dep.in.CutOnEnd(ctx).Stop()
	k := keysFor(l.Key)
	delay := dep.restartDelay(px)
	return dep.up.run(ctx, dep, enter, acquireScript, acquirePrefix, delay, []string{k.lock, k.fence}, value, px, holderOf(l, value), delay, dep.retentionArg, l.Owner)
}

// classify marks the server's refusal of our identity or of a command
// (NOPERM, WRONGPASS, NOAUTH; inside a script, an ERR whose message
// differs by version) as backend.ErrPermission: a configuration error that
// waiting cannot fix.
func classify(err error) error {
	if err == nil {
		return nil // before re, which escapes: no allocation on success
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return err
	}
	for _, code := range aclRefusals {
		if strings.Contains(re.Error(), code) {
			return fmt.Errorf("%w: %w", backend.ErrPermission, err)
		}
	}
	return err
}

var aclRefusals = []string{"NOPERM", "WRONGPASS", "NOAUTH", "The user executing the script can't", "ACL failure in script"}

// released reads a release's answer, warning once of a refused PUBLISH.
func (dep *deployment) released(v int64) bool {
	if v == 2 {
		dep.publishDenied.Do(func() {
			dep.log.Warn("redislock: the server refuses PUBLISH on the release channels ({name}:released): waiters poll instead of being woken; grant the ACL user &* or the channel pattern")
		})
	}
	return v >= 1
}

// run runs s on dep; the end of ctx cuts its reads (interrupt.go).
func (dep *deployment) run(ctx context.Context, s *script, keys []string, args ...any) *redis.Cmd {
	defer dep.in.CutOnEnd(ctx).Stop()
	return s.run(ctx, dep.rdb, keys, args...)
}

// restartDelay is how long, in ms, a server that started refuses every
// name, for a lock of px ms.
func (dep *deployment) restartDelay(px int64) int64 {
	if dep.restartMax < 0 {
		return px
	}
	return min(px, dep.restartMax.Milliseconds())
}

// notAcquired is the error of a refusal: r is 0 or -n (see acquire).
func notAcquired(op string, r int64) error {
	if r < 0 {
		return fmt.Errorf("redislock: %s: %w", op, &backend.NotAcquiredError{Reason: fmt.Sprintf(
			"the server started less than a TTL ago and may have forgotten a holder; it grants this name in %v", time.Duration(-r)*time.Millisecond)})
	}
	return fmt.Errorf("redislock: %s: %w", op, backend.ErrNotAcquired)
}

func (dep *deployment) release(ctx context.Context, l backend.Claim) (bool, error) {
	k := keysFor(l.Key)
	v, err := dep.run(ctx, releaseScript, []string{k.lock}, holder(l), k.channel, "0").Int64()
	return dep.released(v), classify(err)
}

// queueAcquire runs a queue's acquire script for waiter w: fair mode's
// (fair_acquire.lua: "try", "wait", "look") or the default mode's
// (handoff_acquire.lua: "wait", "look"). It answers the fence; 0 when
// queued; -n when w is next and the lock is held, or a restarted server
// refuses the name, for n more ms; redis.Nil when w's entry is gone.
func (dep *deployment) queueAcquire(ctx context.Context, fair bool, l backend.Claim, value string, px int64, w, mode string) (int64, error) {
	k := keysFor(l.Key)
	script, ks := fairAcquireScript, []string{k.lock, k.fence, k.queue, k.live}
	if !fair {
		script, ks = handoffAcquireScript, append(ks, k.hand)
	}
	v, err := dep.run(ctx, script, ks, value, px, holderOf(l, value), w, livenessTTL.Milliseconds(), mode, dep.restartDelay(px), dep.retentionArg, l.Owner).Int64()
	return v, classify(err)
}

// fairRelease is release that names the next waiter in its message.
func (dep *deployment) fairRelease(ctx context.Context, l backend.Claim) (bool, error) {
	k := keysFor(l.Key)
	v, err := dep.run(ctx, fairReleaseScript, []string{k.lock, k.queue, k.live}, holder(l), k.channel, "0").Int64()
	return dep.released(v), classify(err)
}

// leave takes waiter w out of l.Key's queue and cleans up after its
// attempt value. Best effort: a waiter that could not leave is dropped
// once its liveness runs out.
func (dep *deployment) leave(ctx context.Context, l backend.Claim, value, w string) error {
	k := keysFor(l.Key)
	return dep.evalCleanup(ctx, leaveScript, []string{k.lock, k.queue, k.live}, value, k.channel, w)
}

// raise runs the raise script; left is the lock's expiry left, in ms.
func (dep *deployment) raise(ctx context.Context, l backend.Claim, value string, fence uint64, left int64) (bool, error) {
	k := keysFor(l.Key)
	v, err := dep.run(ctx, raiseScript, []string{k.lock, k.fence}, value, strconv.FormatUint(fence, 10), dep.retentionArg, max(left, 1)).Int64()
	return v == 1, classify(err)
}

// cleanup removes what a failed attempt may have left (the script may have
// run though its reply was lost or ctx ended), only if that very attempt
// holds the key. Best effort, bounded.
//
// Clean-ups send the whole script (EVAL), not its hash: they run when a
// connection is in trouble, and a NOSCRIPT answer that never arrives would
// never trigger the fallback.
func (dep *deployment) cleanup(ctx context.Context, l backend.Claim, value string) {
	k := keysFor(l.Key)
	_ = dep.evalCleanup(ctx, releaseScript, []string{k.lock}, value, k.channel, "1")
}

// evalCleanup sends s whole (EVAL), ctx done or not, for cleanupTimeout.
func (dep *deployment) evalCleanup(ctx context.Context, s *script, keys []string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.CutOnEnd(ctx).Stop()
	return s.Eval(ctx, dep.rdb, keys, args...).Err()
}

const cleanupTimeout = 2 * time.Second
