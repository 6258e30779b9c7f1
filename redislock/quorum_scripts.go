package redislock

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// The restart check without INFO: once INFO showed that a server has run
// for X (a power of two seconds), a variant of the acquire script that
// skips the check for delays up to X is loaded there and sent by EVALSHA
// only. Its presence in the script cache, which a restart empties, is the
// proof; NOSCRIPT means the proof is gone, and the plain script checks.
// See docs/backends/redislock.md, Quorum.

// upScript is a server's proven variant of the acquire script.
type upScript struct {
	hash  string
	upMs  int64 // restart delays up to this are known to have passed
	runID string
}

// uptime is what a Quorum knows of one server's uptime.
type uptime struct {
	script  atomic.Pointer[upScript]
	probing atomic.Bool
	next    atomic.Int64 // unix nanoseconds before which no new probe starts
}

// probeEvery paces the probes of a server whose variant is missing.
const probeEvery = time.Second

// quorumPrefix declares the acquire script's settings, from ARGV[4..7]:
// acquire.lua's, and the clock floor's grain (see fence.lua).
const quorumPrefix = "local restart_delay, retention, owner = tonumber(ARGV[4]), ARGV[5], ARGV[6]\nfence_grain = tonumber(ARGV[7])\n"

// quorumAcquireScript is the plain quorum acquire script (with the restart
// check); Run falls back to EVAL.
var quorumAcquireScript = redis.NewScript(lua("value", "fence") + quorumPrefix + lua("acquire"))

// upVariant is the acquire script that skips the restart check for delays
// of at most upMs milliseconds.
func upVariant(upMs int64) string {
	return lua("value", "fence") + quorumPrefix + "if restart_delay <= " + strconv.FormatInt(upMs, 10) + " then restart_delay = 0 end\n" + lua("acquire")
}

// grain is the rounding of the quorum acquire script's clock floor, in
// microseconds: a second, or half the retention if that is shorter.
func (dep *deployment) grain() int64 {
	return max(min(1_000_000, dep.retention*1000/2), 1)
}

var (
	uptimeRe = regexp.MustCompile(`uptime_in_seconds:(\d+)`)
	runIDRe  = regexp.MustCompile(`run_id:([0-9a-f]+)`)
)

// serverInfo reads a server's run_id and uptime from INFO server.
func serverInfo(s string) (runID string, up int64, ok bool) {
	m, r := uptimeRe.FindStringSubmatch(s), runIDRe.FindStringSubmatch(s)
	if m == nil || r == nil {
		return "", 0, false
	}
	up, err := strconv.ParseInt(m[1], 10, 64)
	return r[1], up, err == nil
}

// provenUp is the X for an uptime of up whole seconds (the server has run
// for more than up-1): the largest power of two seconds not above up-1, in
// milliseconds, or 0.
func provenUp(up int64) int64 {
	s := up - 1
	if s < 1 {
		return 0
	}
	x := int64(1)
	for x*2 <= s && x < 1<<30 {
		x *= 2
	}
	return x * 1000
}

// probe learns server i's variant in the background, unless one is being
// learned or was tried less than probeEvery ago.
func (q *Quorum) probe(i int) {
	u := &q.up[i]
	now := time.Now().UnixNano()
	if now < u.next.Load() || !u.probing.CompareAndSwap(false, true) {
		return
	}
	u.next.Store(now + int64(probeEvery))
	closing, done, ok := q.enter()
	if !ok {
		u.probing.Store(false)
		return
	}
	go func() {
		defer done()
		defer u.probing.Store(false)
		ctx, cancel := context.WithTimeout(closing, 2*time.Second)
		defer cancel()
		if s := q.learnUp(ctx, i); s != nil {
			u.script.Store(s)
		}
	}()
}

// learnUp loads server i's variant: INFO, SCRIPT LOAD, INFO again, and the
// variant only if both INFO came from one process that had run long
// enough.
func (q *Quorum) learnUp(ctx context.Context, i int) *upScript {
	dep := q.deps[i]
	defer dep.in.watch(ctx).stop()
	info, err := dep.rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	runID, up, ok := serverInfo(info)
	x := provenUp(up)
	if !ok || x == 0 {
		return nil
	}
	hash, err := dep.rdb.ScriptLoad(ctx, upVariant(x)).Result()
	if err != nil {
		return nil
	}
	info, err = dep.rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	if again, _, ok := serverInfo(info); !ok || again != runID {
		return nil
	}
	return &upScript{hash: hash, upMs: x, runID: runID}
}

// acquireOn runs the quorum acquire script on server i for one attempt
// (see attempt): the fence, 0 when another token holds the lock, -n when
// the server started too recently (see acquire.lua). It sends the proven
// variant when the server has one that covers this restart delay. keys
// are the lock's and fence counter's (lockKeys), built once per attempt.
func (q *Quorum) acquireOn(ctx context.Context, i int, l backend.Claim, keys []string, value string, px int64) (int64, error) {
	dep, u := q.deps[i], &q.up[i]
	delay := dep.restartDelay(px)
	s := u.script.Load()
	fast := delay <= 0 || s != nil && delay <= s.upMs
	if !fast {
		q.probe(i) // for next time
	}
	defer dep.in.watch(ctx).stop()
	args := []any{value, px, holder(l), delay, dep.retention, l.Owner, dep.grain()}
	if s != nil && delay > 0 && delay <= s.upMs {
		v, err := dep.rdb.EvalSha(ctx, s.hash, keys, args...).Int64()
		if err == nil || !isNoScript(err) {
			return v, classify(err)
		}
		// The proof is gone: the plain script checks.
		u.script.CompareAndSwap(s, nil)
		q.probe(i)
	}
	v, err := quorumAcquireScript.Run(ctx, dep.rdb, keys, args...).Int64()
	return v, classify(err)
}

// lockKeys are the acquire script's keys for key.
func lockKeys(key string) []string {
	k := keysFor(key)
	return []string{k.lock, k.fence}
}

func isNoScript(err error) bool { return strings.HasPrefix(err.Error(), "NOSCRIPT") }
