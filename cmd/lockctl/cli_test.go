//go:build unix

package main

import (
	"bytes"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

func fileURL(t *testing.T) string {
	return (&url.URL{Scheme: "file", Path: t.TempDir()}).String()
}

func run(t *testing.T, u string, args ...string) (*proc, int) {
	t.Helper()
	p := lockctlProc(append([]string{"run", "--backend", u}, args...)...)
	code, _ := p.status(t)
	return p, code
}

func TestExitStatusPassesThrough(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	for script, want := range map[string]int{
		"exit 0":        0,
		"exit 7":        7,
		"exit 255":      255,
		"kill -TERM $$": 128 + int(syscall.SIGTERM),
		"kill -KILL $$": 128 + int(syscall.SIGKILL),
		"kill -USR1 $$": 128 + int(syscall.SIGUSR1),
		`test "$LOCKER_NAME" = "n a/me" && test "$LOCKER_FENCE" -gt 0`: 0,
	} {
		p, code := run(t, u, "n a/me", "--", "sh", "-c", script)
		if code != want {
			t.Errorf("COMMAND %q: exit %d, want %d; stderr:\n%s", script, code, want, &p.stderr)
		}
	}
	// Fences grow with each holder of a name (from the directory's
	// counter: a release removes the name's file).
	dir := t.TempDir()
	for range 3 {
		p := lockctlProc("run", "--backend", u, "fenced", "--", "sh", "-c", `echo "$LOCKER_FENCE" >> "$D/f"`)
		p.Env = append(p.Env, "D="+dir)
		if code, _ := p.status(t); code != 0 {
			t.Fatalf("exit %d: %s", code, &p.stderr)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "f"))
	var last int
	for i, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= last || i > 2 {
			t.Fatalf("fences of one name = %q, want 3, increasing", b)
		}
		last = n
	}
	if last == 0 {
		t.Fatalf("fences of one name = %q, want 3, increasing", b)
	}
}

// SIGINT and SIGTERM sent to lockctl reach COMMAND; the lock is released
// once COMMAND has exited.
func TestSignalsPassOn(t *testing.T) {
	t.Parallel()
	u, dir := fileURL(t), t.TempDir()
	for _, c := range []struct {
		sig    syscall.Signal
		script string
		want   int
	}{
		{syscall.SIGTERM, `trap 'exit 42' TERM; echo > "$D/ready"; while :; do sleep 0.05; done`, 42},
		{syscall.SIGINT, `echo > "$D/ready"; exec sleep 60`, 128 + int(syscall.SIGINT)},
		{syscall.SIGTERM, `echo > "$D/ready"; exec sleep 60`, 128 + int(syscall.SIGTERM)},
	} {
		os.Remove(filepath.Join(dir, "ready"))
		p := lockctlProc("run", "--backend", u, "sig", "--", "sh", "-c", c.script)
		p.Env = append(p.Env, "D="+dir)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		waitFile(t, filepath.Join(dir, "ready"), 30*time.Second)
		p.Process.Signal(c.sig)
		p.Wait()
		if got := p.ProcessState.ExitCode(); got != c.want {
			t.Errorf("%v to lockctl running %q: exit %d, want %d; stderr:\n%s", c.sig, c.script, got, c.want, &p.stderr)
		}
		if q, code := run(t, u, "--no-wait", "sig", "--", "true"); code != 0 {
			t.Fatalf("the lock is not free after COMMAND exited: exit %d\n%s", code, &q.stderr)
		}
	}
}

func TestWaitRunsOut(t *testing.T) {
	t.Parallel()
	u, dir := fileURL(t), t.TempDir()
	startHolder(t, dir, "1", "--backend", u, "w")
	p, code := run(t, u, "--wait", "700ms", "w", "--", "true")
	if code != exitNotAcquired || !strings.Contains(p.stderr.String(), "not acquired within") {
		t.Fatalf("--wait on a held lock: exit %d, stderr %q; want %d", code, &p.stderr, exitNotAcquired)
	}
	// SIGINT while waiting: COMMAND never runs. A SIGINT that comes
	// before lockctl handles signals at all (the Go runtime's default:
	// the process dies of it) came too early for the test, not late for
	// lockctl: a loaded machine may take more than half a second to start
	// it. Then it is sent again to a new run, later, up to 3 times.
	var w *proc
	for i, wait := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second} {
		w = lockctlProc("run", "--backend", u, "w", "--", "sh", "-c", `echo ran > "$D/ran"`)
		w.Env = append(w.Env, "D="+dir)
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(wait)
		w.Process.Signal(syscall.SIGINT)
		w.Wait()
		if ws, ok := w.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || i == 2 {
			break
		}
		t.Logf("lockctl died of SIGINT %v after its start, before it handled signals: again, later", wait)
	}
	if got := w.ProcessState.ExitCode(); got != 128+int(syscall.SIGINT) {
		t.Errorf("SIGINT while waiting: exit %d, want %d; stderr:\n%s", got, 128+int(syscall.SIGINT), &w.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("COMMAND ran although the wait was interrupted")
	}
}

func TestCommandNotStartable(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	p, code := run(t, u, "nc", "--", "/no/such/command")
	if code != exitNoCommand || !strings.Contains(p.stderr.String(), "cannot run") {
		t.Fatalf("missing COMMAND: exit %d, stderr %q; want %d", code, &p.stderr, exitNoCommand)
	}
	notExec := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644)
	if p, code := run(t, u, "nc", "--", notExec); code != exitNoCommand {
		t.Fatalf("non-executable COMMAND: exit %d; stderr %q", code, &p.stderr)
	}
	if p, code := run(t, u, "--no-wait", "nc", "--", "true"); code != 0 {
		t.Fatalf("the lock was not released after COMMAND failed to start: exit %d\n%s", code, &p.stderr)
	}
}

func TestBadInputExits2(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	dir := t.TempDir()
	marker := `echo ran > "` + filepath.Join(dir, "ran") + `"`
	cases := map[string][]string{
		"empty name":                          {"run", "--backend", u, "", "--", "sh", "-c", marker},
		"invalid UTF-8":                       {"run", "--backend", u, "a\xffb", "--", "sh", "-c", marker},
		"name too long":                       {"run", "--backend", u, strings.Repeat("x", 257), "--", "sh", "-c", marker},
		"no command":                          {"run", "--backend", u, "x", "--"},
		"no name":                             {"run", "--backend", u},
		"bad ttl":                             {"run", "--backend", u, "--ttl", "-1s", "x", "--", "sh", "-c", marker},
		"huge ttl":                            {"run", "--backend", u, "--ttl", "1000h", "x", "--", "sh", "-c", marker},
		"not a duration":                      {"run", "--backend", u, "--ttl", "5x", "x", "--", "sh", "-c", marker},
		"wait and no-wait":                    {"run", "--backend", u, "--wait", "1s", "--no-wait", "x", "--", "sh", "-c", marker},
		"unknown flag":                        {"run", "--backend", u, "--frobnicate", "x", "--", "sh", "-c", marker},
		"unknown scheme":                      {"run", "--backend", "bogus://x", "x", "--", "sh", "-c", marker},
		"unknown parameter":                   {"run", "--backend", u + "?colour=red", "x", "--", "sh", "-c", marker},
		"bad namespace":                       {"run", "--backend", u + "?namespace=a/b", "x", "--", "sh", "-c", marker},
		"unknown command":                     {"frobnicate"},
		"backends with args":                  {"backends", "x"},
		"unreachable server":                  {"run", "--backend", "redis://127.0.0.1:1/0", "--connect-timeout", "1s", "x", "--", "sh", "-c", marker},
		"unreachable server, waiting forever": {"run", "--backend", "etcd://127.0.0.1:1", "--connect-timeout", "1s", "x", "--", "sh", "-c", marker},
	}
	for what, args := range cases {
		p := lockctlProc(args...)
		code, took := p.status(t)
		msg := strings.TrimSpace(p.stderr.String())
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d; stderr:\n%s", what, code, exitUsage, msg)
			continue
		}
		if msg == "" || !strings.Contains(msg, "lockctl") {
			t.Errorf("%s: stderr %q, want a message from lockctl", what, msg)
		}
		if n := strings.Count(msg, "\n"); n > 0 {
			t.Errorf("%s: %d lines on stderr, want one:\n%s", what, n+1, msg)
		}
		if strings.HasPrefix(what, "unreachable") {
			if took > 5*time.Second {
				t.Errorf("%s: took %v with --connect-timeout 1s", what, took)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("COMMAND ran after an error")
	}
}

func TestDefaultBackendAndEnv(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "linux" { // where $XDG_CACHE_HOME is the cache directory
		cache := t.TempDir()
		// No --backend, no LOCKER_URL: the file backend under the cache directory.
		p := lockctlProc("run", "d", "--", "true")
		p.Env = append(p.Env, "XDG_CACHE_HOME="+cache)
		if code, _ := p.status(t); code != 0 {
			t.Fatalf("default backend: exit %d\n%s", code, &p.stderr)
		}
		// The lock file went with the release; the fence counter stays.
		if _, err := os.Stat(filepath.Join(cache, "lockctl", "fence.counter")); err != nil {
			t.Fatalf("the default directory: %v", err)
		}
	}
	// LOCKER_URL picks the backend; --backend overrides it.
	dir := t.TempDir()
	p := lockctlProc("run", "e", "--", "true")
	p.Env = append(p.Env, "LOCKER_URL="+(&url.URL{Scheme: "file", Path: dir}).String())
	if code, _ := p.status(t); code != 0 {
		t.Fatalf("LOCKER_URL: exit %d\n%s", code, &p.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "fence.counter")); err != nil {
		t.Fatalf("$LOCKER_URL's directory: %v", err)
	}
	p = lockctlProc("--backend", "mem://", "run", "e", "--", "true")
	p.Env = append(p.Env, "LOCKER_URL=bogus://")
	if code, _ := p.status(t); code != 0 {
		t.Fatalf("--backend over LOCKER_URL: exit %d\n%s", code, &p.stderr)
	}
}

// --owner makes a nested run on the same name reentrant; without it, the
// nested run is another holder.
func TestNestedOwner(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	nested := func(outer, inner string) int {
		args := []string{"run", "--backend", u}
		if outer != "" {
			args = append(args, "--owner", outer)
		}
		args = append(args, "n", "--", lockctlBin, "run", "--backend", u, "--no-wait")
		if inner != "" {
			args = append(args, "--owner", inner)
		}
		args = append(args, "n", "--", "sh", "-c", `test "$LOCKER_OWNER" = "`+inner+`" || exit 9`)
		p := lockctlProc(args...)
		code, _ := p.status(t)
		return code
	}
	if code := nested("job-1", "job-1"); code != 0 {
		t.Errorf("nested run with the same owner: exit %d, want 0", code)
	}
	if code := nested("job-1", "job-2"); code != exitNotAcquired {
		t.Errorf("nested run with another owner: exit %d, want %d", code, exitNotAcquired)
	}
	if code := nested("", ""); code != exitNotAcquired {
		t.Errorf("nested run without owner: exit %d, want %d", code, exitNotAcquired)
	}
}

func TestBackendsCommand(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := lockctl([]string{"backends"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, &errb)
	}
	for _, s := range backend.Schemes() {
		if !strings.Contains(out.String(), s.Name+" ") || !strings.Contains(out.String(), s.Usage) {
			t.Errorf("scheme %s missing from:\n%s", s.Name, &out)
		}
	}
	for _, want := range []string{"file", "mem", "redis", "etcd", "zk", "postgres", "memcache"} {
		if !strings.Contains(out.String(), "\n"+want+" ") {
			t.Errorf("%s not compiled in:\n%s", want, &out)
		}
	}
}

// After "--", a NAME may start with '-'.
func TestDashName(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	if p, code := run(t, u, "--", "-x", "--", "sh", "-c", `test "$LOCKER_NAME" = -x`); code != 0 {
		t.Fatalf("exit %d: %s", code, &p.stderr)
	}
}

// A COMMAND that ignores SIGTERM after a lost lock is killed after --grace.
func TestLostLockGraceKill(t *testing.T) {
	t.Parallel()
	u, dir := fileURL(t), t.TempDir()
	p := lockctlProc("run", "--backend", u, "--ttl", "1s", "--grace", "1s", "g", "--",
		"sh", "-c", `trap '' TERM; echo $$ > "$D/child.1"; echo "$LOCKER_FENCE" > "$D/held.1"; sleep 60`)
	p.Env = append(p.Env, "D="+dir)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { p.Process.Signal(syscall.SIGCONT); p.Process.Kill() }()
	waitFile(t, filepath.Join(dir, "held.1"), 30*time.Second)
	child := childPID(t, dir, "1")
	defer syscall.Kill(-child, syscall.SIGKILL)
	p.Process.Signal(syscall.SIGSTOP)
	if q, code := run(t, u, "--wait", "30s", "g", "--", "true"); code != 0 {
		t.Fatalf("taking the stopped holder's lock: exit %d: %s", code, &q.stderr)
	}
	continued := time.Now()
	p.Process.Signal(syscall.SIGCONT)
	p.Wait()
	took := time.Since(continued)
	if code := p.ProcessState.ExitCode(); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitLost, &p.stderr)
	}
	if took < time.Second || took > 5*time.Second {
		t.Errorf("exited %v after SIGCONT, want after the 1s grace period", took)
	}
	// The group's last process, orphaned, is reaped by init a moment later.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := syscall.Kill(-child, 0)
		if errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("COMMAND's process group is still there after SIGKILL (kill 0: %v)", err)
		}
	}
}

func TestExpandURL(t *testing.T) {
	t.Setenv("LOCKCTL_TEST_PW", "p@ss/w:rd %?#&=+${}")
	got, names, err := expandURL("redis://user:${LOCKCTL_TEST_PW}@h:6379/0?x=$y")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "LOCKCTL_TEST_PW" {
		t.Fatalf("replaced %v, want [LOCKCTL_TEST_PW]", names)
	}
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); pw != "p@ss/w:rd %?#&=+${}" || u.Host != "h:6379" || u.RawQuery != "x=$y" {
		t.Fatalf("expanded %q: password %q host %q query %q", got, pw, u.Host, u.RawQuery)
	}
	for _, bad := range []string{"redis://:${LOCKCTL_UNSET_VAR}@h", "redis://:${LOCKCTL_TEST_PW@h", "redis://:${}@h"} {
		if _, _, err := expandURL(bad); err == nil {
			t.Errorf("expandURL(%q) succeeded", bad)
		}
	}
	// Through lockctl: the variable is read from lockctl's environment.
	dir := t.TempDir()
	p := lockctlProc("run", "x", "--", "true")
	p.Env = append(p.Env, "LOCKER_URL="+(&url.URL{Scheme: "file", Path: dir}).String()+"/${LOCKCTL_SUB}", "LOCKCTL_SUB=a b/c")
	if code, _ := p.status(t); code != 0 {
		t.Fatalf("exit %d: %s", code, &p.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "a b", "c", "fence.counter")); err != nil {
		t.Fatalf("the directory named by ${LOCKCTL_SUB}: %v", err)
	}
	// COMMAND does not get the variables substituted into the URL (they
	// hold passwords), and a nested run for the same owner and name still
	// finds the enclosing run's hold without them.
	out := filepath.Join(dir, "env")
	p = lockctlProc("run", "--owner", "o", "x", "--", "sh", "-c",
		`echo "sub=${LOCKCTL_SUB-unset} other=$LOCKCTL_OTHER" > "$OUT"; exec "$LOCKCTL" run --owner o x -- sh -c 'echo nested=$LOCKER_NAME >> "$OUT"'`)
	p.Env = append(p.Env, "LOCKER_URL="+(&url.URL{Scheme: "file", Path: dir}).String()+"/${LOCKCTL_SUB}",
		"LOCKCTL_SUB=a b/c", "LOCKCTL_OTHER=kept", "OUT="+out, "LOCKCTL="+lockctlBin)
	if code, _ := p.status(t); code != 0 {
		t.Fatalf("exit %d: %s", code, &p.stderr)
	}
	if b, _ := os.ReadFile(out); string(b) != "sub=unset other=kept\nnested=x\n" {
		t.Fatalf("COMMAND's environment: %q, want the substituted variable gone, the others kept, and the nested run under the hold", b)
	}
	p = lockctlProc("run", "--backend", "redis://:${LOCKCTL_UNSET_VAR}@127.0.0.1:6379/0", "x", "--", "true")
	if code, _ := p.status(t); code != exitUsage || !strings.Contains(p.stderr.String(), "LOCKCTL_UNSET_VAR") {
		t.Fatalf("unset variable: exit %d, stderr %q", code, &p.stderr)
	}
}

// A reentrant nested run's COMMAND stays in the enclosing COMMAND's process
// group: a signal to the outer lockctl reaches it.
func TestNestedOwnerSignals(t *testing.T) {
	t.Parallel()
	u, dir := fileURL(t), t.TempDir()
	p := lockctlProc("run", "--backend", u, "--owner", "o", "n", "--",
		lockctlBin, "run", "--backend", u, "--owner", "o", "n", "--", "sh", "-c", `echo $$ > "$D/child.1"; echo 1 > "$D/held.1"; exec sleep 60`)
	p.Env = append(p.Env, "D="+dir)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Process.Kill()
	waitFile(t, filepath.Join(dir, "held.1"), 30*time.Second)
	inner := childPID(t, dir, "1")
	defer syscall.Kill(inner, syscall.SIGKILL)
	p.Process.Signal(syscall.SIGTERM)
	p.Wait()
	if got, want := p.ProcessState.ExitCode(), 128+int(syscall.SIGTERM); got != want {
		t.Errorf("exit %d, want %d; stderr:\n%s", got, want, &p.stderr)
	}
	if err := syscall.Kill(inner, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the nested COMMAND %d survived (kill 0: %v)", inner, err)
	}
}

// Several names before -- are held together, all or nothing: COMMAND gets
// them and their fences in LOCKER_NAMES and LOCKER_FENCES, in their byte
// order; -n with one of them held runs nothing and holds none.
func TestSeveralNames(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	script := `test "$LOCKER_NAMES" = "$(printf 'a\nb\nc')" && test "$(echo "$LOCKER_FENCES" | wc -l)" -eq 3 && test -z "$LOCKER_NAME"`
	if p, code := run(t, u, "c", "a", "b", "--", "sh", "-c", script); code != 0 {
		t.Fatalf("exit %d: %s", code, &p.stderr)
	}
	// b held by a run that waits for a signal file.
	dir := t.TempDir()
	holder := lockctlProc("run", "--backend", u, "b", "--", "sh", "-c", `echo >"$D/held"; while test ! -e "$D/done"; do sleep 0.05; done`)
	holder.Env = append(holder.Env, "D="+dir)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "held"), 20*time.Second)
	p, code := run(t, u, "-n", "a", "b", "c", "--", "true")
	if code != exitNotAcquired || !strings.Contains(p.stderr.String(), `"b"`) {
		t.Errorf("-n with b held: exit %d, want %d naming b; stderr:\n%s", code, exitNotAcquired, &p.stderr)
	}
	// Neither a nor c was kept.
	if p, code := run(t, u, "-n", "a", "c", "--", "true"); code != 0 {
		t.Errorf("a and c after the refused set: exit %d; stderr:\n%s", code, &p.stderr)
	}
	os.WriteFile(filepath.Join(dir, "done"), nil, 0o600)
	if err := holder.Wait(); err != nil {
		t.Errorf("holder: %v: %s", err, &holder.stderr)
	}
}
