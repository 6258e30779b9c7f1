package redislock

import (
	"context"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The restart check without INFO: once INFO showed that a server has run
// for X (a power of two seconds), a variant of the acquire script that
// skips the check for delays up to X is loaded there and sent by EVALSHA
// only: its presence in the script cache, which a restart empties, is the
// proof (NOSCRIPT: gone). Only Redis 7 and later (before, a replicated
// server reloaded its script cache from RDB), and only on a *redis.Client
// (a cluster's INFO may reach another server than its scripts). See
// docs/backends/redislock.md, The restart check without INFO.

// upScript is a server's proven variant of the acquire script.
type upScript struct {
	hash  any   // boxed once (see evalsha)
	upMs  int64 // restart delays up to this are known to have passed
	runID string
}

// uptime is what is known of one server's uptime.
type uptime struct {
	script  atomic.Pointer[upScript]
	probing atomic.Bool
	next    atomic.Int64 // unix nanoseconds before which no new probe starts
}

// probeEvery paces the probes of a server whose variant is missing.
const probeEvery = time.Second

// upVariant is the acquire script that skips delays up to upMs ms.
func upVariant(prefix string, upMs int64) string {
	return lua("fence") + prefix + "if restart_delay <= " + strconv.FormatInt(upMs, 10) + " then restart_delay = 0 end\n" + lua("acquire")
}

// serverInfo reads run_id and uptime from INFO server; not ok before 7.
func serverInfo(s string) (runID string, up int64, ok bool) {
	runID = infoField(s, "run_id")
	major, _, _ := strings.Cut(infoField(s, "redis_version"), ".")
	up, err := strconv.ParseInt(infoField(s, "uptime_in_seconds"), 10, 64)
	if v, _ := strconv.Atoi(major); v < 7 || err != nil || runID == "" {
		return "", 0, false
	}
	return runID, up, true
}

// provenUp is the X for an uptime of up whole seconds: the largest power
// of two seconds not above up-1, in milliseconds, or 0.
func provenUp(up int64) int64 {
	if up < 2 {
		return 0
	}
	return min(int64(1)<<(bits.Len64(uint64(up-1))-1), 1<<30) * 1000
}

// run runs the acquire script for a restart delay of delay ms: the proven
// variant when one covers it, else plain, and learns a variant in the
// background (enter: the owner's gate). A nil u (a cluster, a ring) runs
// plain.
func (u *uptime) run(ctx context.Context, dep *deployment, enter func() (context.Context, func(), bool), plain *script, prefix string, delay int64, keys []string, args ...any) (int64, error) {
	if u != nil && delay > 0 {
		if s := u.script.Load(); s != nil && delay <= s.upMs {
			v, err := evalsha(ctx, dep.rdb, s.hash, "", keys, args...).Int64()
			if !isNoScript(err) {
				return v, classify(err)
			}
			// The proof is gone: the plain script checks.
			u.script.CompareAndSwap(s, nil)
		}
		u.probe(dep, enter, prefix)
	}
	v, err := plain.run(ctx, dep.rdb, keys, args...).Int64()
	return v, classify(err)
}

// probe learns the variant in the background, at most every probeEvery.
func (u *uptime) probe(dep *deployment, enter func() (context.Context, func(), bool), prefix string) {
	now := time.Now().UnixNano()
	if now < u.next.Load() || !u.probing.CompareAndSwap(false, true) {
		return
	}
	u.next.Store(now + int64(probeEvery))
	closing, done, ok := enter()
	if !ok {
		u.probing.Store(false)
		return
	}
	go func() {
		defer done()
		defer u.probing.Store(false)
		ctx, cancel := context.WithTimeout(closing, 2*time.Second)
		defer cancel()
		if s := dep.learnUp(ctx, prefix); s != nil {
			u.script.Store(s)
		}
	}()
}

// learnUp loads the variant: INFO, SCRIPT LOAD, INFO again; kept only if
// both INFO came from one process that had run long enough.
func (dep *deployment) learnUp(ctx context.Context, prefix string) *upScript {
	defer dep.in.CutOnEnd(ctx).Stop()
	info, err := dep.rdb.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	runID, up, ok := serverInfo(info)
	x := provenUp(up)
	if !ok || x == 0 {
		return nil
	}
	hash, err := dep.rdb.ScriptLoad(ctx, upVariant(prefix, x)).Result()
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

// isNoScript reports a NOSCRIPT answer. (HasErrorPrefix allocates, even
// for a nil err.)
func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
