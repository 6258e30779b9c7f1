//go:build unix

package main

// End-to-end tests: they build lockctl and run it as real processes, against
// the file backend and every server of scripts/services.sh.

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

var lockctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockctl-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockctlBin = filepath.Join(dir, "lockctl")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	if out, err := exec.Command(gobin, "build", "-o", lockctlBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building lockctl: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// target is one backend the processes share.
type target struct {
	name  string
	url   func(t testing.TB) string // a URL with a namespace of the test's own
	addrs []string                  // servers to Require
	// ttl is the --ttl the tests use, life how long a lock outlives a
	// holder that stopped refreshing it (the TTL, or the session timeout),
	// and gran how much later than that the store may free it.
	ttl, life, gran time.Duration
}

func uniq() string { return testutil.RandHex(4) }

// withNamespace adds a namespace unique to the test to raw.
func withNamespace(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("namespace", "e2e-"+uniq())
	u.RawQuery = q.Encode()
	return u.String()
}

func targets() []target {
	fixed := func(raw string) func(testing.TB) string {
		return func(testing.TB) string { return withNamespace(raw) }
	}
	const ttl = 2 * time.Second
	return []target{
		{name: "file", ttl: ttl, life: ttl, url: func(t testing.TB) string {
			return withNamespace((&url.URL{Scheme: "file", Path: t.TempDir()}).String())
		}},
		{name: "redis", ttl: ttl, life: ttl, addrs: []string{testenv.RedisAddr()},
			url: fixed("redis://" + testenv.RedisAddr() + "/0")},
		{name: "etcd", ttl: ttl, life: ttl, gran: time.Second, addrs: testenv.EtcdEndpoints(),
			url: fixed("etcd://" + strings.Join(testenv.EtcdEndpoints(), ",") + "/locker-e2e")},
		{name: "zk", ttl: ttl, life: 2 * time.Second, gran: time.Second, addrs: testenv.ZKAddrs(),
			url: fixed("zk://" + strings.Join(testenv.ZKAddrs(), ",") + "/locker-e2e?session_timeout=2s")},
		{name: "postgres", ttl: ttl, life: ttl, addrs: []string{testenv.PostgresAddr()},
			url: fixed(testenv.PostgresURL())},
		{name: "memcache", ttl: ttl, life: ttl, gran: time.Second, addrs: []string{testenv.MemcacheAddr()},
			url: fixed("memcache://" + testenv.MemcacheAddr())},
		{name: "mysql", ttl: ttl, life: ttl, addrs: []string{testenv.MySQLAddr()},
			url: fixed(testenv.MySQLURL())},
		{name: "sqlite", ttl: ttl, life: ttl, url: func(t testing.TB) string {
			return withNamespace((&url.URL{Scheme: "sqlite", Path: filepath.Join(t.TempDir(), "locks.db")}).String())
		}},
	}
}

// env is the test process's environment without lockctl's variables, so
// that an outer LOCKER_URL cannot change what the tests talk to.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOCKER_") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

type proc struct {
	*exec.Cmd
	stderr bytes.Buffer
}

func lockctlProc(args ...string) *proc {
	p := &proc{Cmd: exec.Command(lockctlBin, args...)}
	p.Env = env()
	p.Stderr = &p.stderr
	// A killed lockctl's child may keep the stderr pipe open: do not wait
	// for it.
	p.WaitDelay = time.Second
	return p
}

// status runs p to its end and returns its exit status and how long it took.
func (p *proc) status(t testing.TB) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	err := p.Run()
	took := time.Since(start)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("lockctl %q: %v", p.Args[1:], err)
	}
	return p.ProcessState.ExitCode(), took
}

// waitFile waits until path exists and returns its trimmed content.
func waitFile(t testing.TB, path string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v", path, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holderScript records the child's PID and fence in dir, then sleeps.
const holderScript = `echo $$ > "$D/child.$1"; echo "$LOCKER_FENCE" > "$D/held.$1"; exec sleep 60`

// startHolder starts `lockctl run` holding name with a long-running child,
// waits until the child runs, and returns it with the child's fence. The
// child's process group is killed at cleanup, whatever happened.
func startHolder(t testing.TB, dir, tag string, args ...string) (*proc, uint64) {
	t.Helper()
	full := append([]string{"run"}, args...)
	full = append(full, "--", "sh", "-c", holderScript, "sh", tag)
	p := lockctlProc(full...)
	p.Env = append(p.Env, "D="+dir)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Process.Signal(syscall.SIGCONT)
		p.Process.Kill()
		p.Wait()
		if b, err := os.ReadFile(filepath.Join(dir, "child."+tag)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	fence := waitFile(t, filepath.Join(dir, "held."+tag), 30*time.Second)
	f, err := strconv.ParseUint(fence, 10, 64)
	if err != nil || f == 0 {
		t.Fatalf("holder's LOCKER_FENCE = %q", fence)
	}
	return p, f
}

func childPID(t testing.TB, dir, tag string) int {
	b, err := os.ReadFile(filepath.Join(dir, "child."+tag))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestBackends runs the multi-process scenarios against every backend,
// the backends in parallel and the scenarios of one backend in turn.
func TestBackends(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			t.Run("NoWaitOnHeldLock", func(t *testing.T) { noWait(t, tg) })
			t.Run("KillHolder", func(t *testing.T) { killHolder(t, tg) })
			t.Run("StopPastTTL", func(t *testing.T) { stopPastTTL(t, tg) })
			t.Run("TakingTurns", func(t *testing.T) { takingTurns(t, tg) })
		})
	}
}

func common(tg target, u string) []string {
	return []string{"--backend", u, "--ttl", tg.ttl.String()}
}

// noWait: --no-wait on a held lock exits 75 at once (well before the
// holder's minute is up), and a holder's COMMAND killed by a signal makes
// it exit 128+N.
func noWait(t testing.TB, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "no-wait"
	holder, _ := startHolder(t, dir, "1", append(common(tg, u), name)...)

	p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--no-wait", name, "--", "true")...)
	code, took := p.status(t)
	if code != exitNotAcquired {
		t.Fatalf("--no-wait on a held lock: exit %d, want %d; stderr:\n%s", code, exitNotAcquired, &p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "held by another") {
		t.Errorf("--no-wait stderr = %q, want it to say the lock is held", &p.stderr)
	}
	// A process start, a connection and one try: a second on an idle
	// machine, more on a loaded one (a ZooKeeper session, an etcd client).
	// A --no-wait that waited would wait for the holder's minute.
	t.Logf("--no-wait exited %d after %v (process start, connect, one try)", code, took)
	if took > 15*time.Second {
		t.Errorf("--no-wait took %v, want well within the holder's minute", took)
	}

	// SIGTERM to the holder reaches its child, which dies of it.
	holder.Process.Signal(syscall.SIGTERM)
	holder.Wait()
	if got, want := holder.ProcessState.ExitCode(), 128+int(syscall.SIGTERM); got != want {
		t.Fatalf("holder whose child died of SIGTERM: exit %d, want %d; stderr:\n%s", got, want, &holder.stderr)
	}
	// ... and the holder released the lock.
	p = lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--no-wait", name, "--", "true")...)
	if code, _ := p.status(t); code != 0 {
		t.Fatalf("--no-wait after the holder exited: exit %d; stderr:\n%s", code, &p.stderr)
	}
}

// killHolder: after kill -9 of a holder, a `run --wait` already waiting
// acquires within the lock's life plus the store's granularity.
func killHolder(t testing.TB, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "kill-9"
	holder, fence := startHolder(t, dir, "1", append(common(tg, u), name)...)

	p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "60s", name, "--", "sh", "-c", `echo "$LOCKER_FENCE" > "$D/next"`)...)
	p.Env = append(p.Env, "D="+dir)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // let it start, connect and wait
	killed := time.Now()
	holder.Process.Kill()
	holder.Wait()
	next, err := strconv.ParseUint(waitFile(t, filepath.Join(dir, "next"), tg.life+tg.gran+30*time.Second), 10, 64)
	took := time.Since(killed)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("run --wait after kill -9 of the holder: %v; stderr:\n%s", err, &p.stderr)
	}
	// The waiter polls (up to 250ms apart on backends without a queue or
	// notifications), and the machine is busy.
	bound := tg.life + tg.gran + 1500*time.Millisecond
	t.Logf("acquired %v after kill -9 (lock life %v, granularity %v)", took, tg.life, tg.gran)
	if took > bound {
		t.Errorf("acquired %v after kill -9, want within %v", took, bound)
	}
	if next <= fence {
		t.Errorf("fence %d after the killed holder's %d: must increase", next, fence)
	}
}

// stopPastTTL: a holder stopped past its TTL loses the lock to another;
// once continued it reports the loss, its child is gone and it exits 76.
func stopPastTTL(t testing.TB, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "sigstop"
	holder, fence := startHolder(t, dir, "1", append(common(tg, u), "--grace", "3s", name)...)
	child := childPID(t, dir, "1")
	holder.Process.Signal(syscall.SIGSTOP)

	p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "60s", name, "--", "sh", "-c", `echo "$LOCKER_FENCE" > "$D/second"`)...)
	p.Env = append(p.Env, "D="+dir)
	if code, took := p.status(t); code != 0 {
		t.Fatalf("run --wait while the holder is stopped: exit %d after %v; stderr:\n%s", code, took, &p.stderr)
	}
	second, _ := strconv.ParseUint(waitFile(t, filepath.Join(dir, "second"), time.Second), 10, 64)
	if second <= fence {
		t.Errorf("fence %d after the stopped holder's %d: must increase", second, fence)
	}

	continued := time.Now()
	holder.Process.Signal(syscall.SIGCONT)
	done := make(chan struct{})
	go func() { holder.Wait(); close(done) }()
	within := tg.life + tg.gran + 3*time.Second + 5*time.Second
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("the continued holder did not exit within %v; stderr so far:\n%s", within, &holder.stderr)
	}
	t.Logf("the continued holder exited %v after SIGCONT", time.Since(continued))
	if got := holder.ProcessState.ExitCode(); got != exitLost {
		t.Errorf("continued holder: exit %d, want %d; stderr:\n%s", got, exitLost, &holder.stderr)
	}
	if !strings.Contains(holder.stderr.String(), "lost the lock") {
		t.Errorf("continued holder's stderr does not report the loss:\n%s", &holder.stderr)
	}
	if err := syscall.Kill(child, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the lost holder's child %d is still there (kill 0: %v)", child, err)
	}
}

// turnScript checks that it is alone in the critical section (mkdir is
// atomic) and appends its fence to the log, in order of entry.
const turnScript = `mkdir "$D/inside" 2>/dev/null || { echo "overlap: fence $LOCKER_FENCE" >> "$D/errors"; exit 1; }
echo "$LOCKER_FENCE" >> "$D/log"
sleep 0.01
rmdir "$D/inside"`

// takingTurns: 10 processes × 20 turns of lockctl run on one name. Nobody
// is ever inside together, and the fences in order of entry strictly
// increase.
func takingTurns(t testing.TB, tg target) {
	procs, turns := 10, 20
	if testing.Short() {
		procs, turns = 4, 5
	}
	u, dir, name := tg.url(t), t.TempDir(), "turns"
	start := time.Now()
	var wg sync.WaitGroup
	for w := range procs {
		wg.Go(func() {
			for i := range turns {
				p := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "2m", name, "--", "sh", "-c", turnScript)...)
				p.Env = append(p.Env, "D="+dir)
				if err := p.Run(); err != nil {
					t.Errorf("process %d turn %d: %v; stderr:\n%s", w, i, err, &p.stderr)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d processes × %d turns in %v", procs, turns, time.Since(start))
	if b, err := os.ReadFile(filepath.Join(dir, "errors")); err == nil {
		t.Fatalf("critical section shared:\n%s", b)
	}
	b, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	if len(lines) != procs*turns {
		t.Fatalf("%d entries in the log, want %d", len(lines), procs*turns)
	}
	var last uint64
	for i, s := range lines {
		f, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("entry %d: LOCKER_FENCE %q", i, s)
		}
		if f <= last {
			t.Fatalf("entry %d: fence %d after %d: fences in order of entry must strictly increase", i, f, last)
		}
		last = f
	}
}
