//go:build unix

package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// ttlTargets are targets() with ZooKeeper as lockctl users write it: no
// session_timeout, so that --ttl sets the session timeout. A second zk
// target sets session_timeout=3s, which wins over --ttl.
func ttlTargets() []target {
	zk := "zk://" + strings.Join(testenv.ZKAddrs(), ",") + "/locker-e2e"
	var out []target
	for _, tg := range targets() {
		if tg.name == "memcache" {
			// An abandoned lock goes one to two seconds after its TTL
			// (memcachelock's doc, TTLs).
			tg.gran = 2 * time.Second
		}
		if tg.name == "zk" {
			tg.url = func(testing.TB) string { return withNamespace(zk) }
			tg.life = tg.ttl
			out = append(out, tg)
			tg.name = "zk-session_timeout"
			tg.url = func(testing.TB) string { return withNamespace(zk + "?session_timeout=3s") }
			tg.life = 3 * time.Second
		}
		out = append(out, tg)
	}
	return out
}

// TestTTLCrashRecovery: --ttl means the same on every backend. `lockctl run
// --ttl 2s -v` reports the TTL the backend granted; after kill -9 of it, a
// `run --wait` started then acquires within that TTL plus the store's
// granularity.
func TestTTLCrashRecovery(t *testing.T) {
	for _, tg := range ttlTargets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			crashRecovery(t, tg)
		})
	}
}

var grantedTTL = regexp.MustCompile(`acquired "[^"]*" on \S+ \(fence \d+, ttl ([^)]+)\)`)

func crashRecovery(t *testing.T, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "ttl-crash"
	holder, fence := startHolder(t, dir, "1", append(common(tg, u), "-v", name)...)

	killed := time.Now()
	holder.Process.Kill()
	p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "60s", name, "--", "sh", "-c", `echo "$LOCKER_FENCE" > "$D/next"`)...)
	p.Env = append(p.Env, "D="+dir)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	next := waitFile(t, filepath.Join(dir, "next"), tg.life+tg.gran+30*time.Second)
	took := time.Since(killed)
	if err := p.Wait(); err != nil {
		t.Fatalf("run --wait after kill -9 of the holder: %v; stderr:\n%s", err, &p.stderr)
	}
	holder.Wait()

	m := grantedTTL.FindStringSubmatch(holder.stderr.String())
	if m == nil {
		t.Fatalf("the holder's -v output does not report its TTL:\n%s", &holder.stderr)
	}
	granted, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatalf("-v reports ttl %q: %v", m[1], err)
	}
	if granted != tg.life {
		t.Errorf("-v reports ttl %v for --ttl %v, want %v", granted, tg.ttl, tg.life)
	}
	// Process start and connect, polling (up to 250ms apart on backends
	// without a queue or notifications) and a busy machine.
	bound := granted + tg.gran + 1500*time.Millisecond
	t.Logf("acquired %v after kill -9 (-v: ttl %v, granularity %v)", took, granted, tg.gran)
	if took > bound {
		t.Errorf("acquired %v after kill -9 of a holder with ttl %v, want within %v", took, granted, bound)
	}
	if n, err := strconv.ParseUint(next, 10, 64); err != nil || n <= fence {
		t.Errorf("fence %q after the killed holder's %d: must increase", next, fence)
	}
}

// TestLockDelayAfterKill: with --lock-delay D, kill -9 of the holder keeps
// the name from the next run until D after the lock's expiry, and no
// sooner: the killed holder's lock was valid when it died, so the store
// frees it no earlier than D after the kill. On etcd the delay counts from
// the session's end, at most a TTL after the kill. ZooKeeper refuses the
// flag (exit 2).
func TestLockDelayAfterKill(t *testing.T) {
	const delay = 6 * time.Second
	for _, tg := range targets() {
		switch tg.name {
		case "file", "redis", "postgres", "etcd":
		default:
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			u, dir, name := tg.url(t), t.TempDir(), "lock-delay-kill"
			holder, fence := startHolder(t, dir, "1", append(common(tg, u), "--lock-delay", delay.String(), name)...)
			killed := time.Now()
			holder.Process.Kill()
			p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "60s", name, "--", "sh", "-c", `echo "$LOCKER_FENCE" > "$D/next"`)...)
			p.Env = append(p.Env, "D="+dir)
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			next := waitFile(t, filepath.Join(dir, "next"), tg.ttl+delay+30*time.Second)
			took := time.Since(killed)
			if err := p.Wait(); err != nil {
				t.Fatalf("run --wait after kill -9 of the holder: %v; stderr:\n%s", err, &p.stderr)
			}
			holder.Wait()
			if took < delay {
				t.Errorf("acquired %v after kill -9 of a holder with --lock-delay %v", took, delay)
			}
			if bound := tg.ttl + delay + tg.gran + 1500*time.Millisecond; took > bound {
				t.Errorf("acquired %v after kill -9, want within %v (TTL %v + delay)", took, bound, tg.ttl)
			}
			if n, err := strconv.ParseUint(next, 10, 64); err != nil || n <= fence {
				t.Errorf("fence %q after the killed holder's %d: must increase", next, fence)
			}
		})
	}
}
