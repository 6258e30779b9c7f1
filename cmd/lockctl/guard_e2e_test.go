//go:build unix

package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// TestGuardian: COMMAND never outlives lockctl's lock. After kill -9 of
// lockctl, COMMAND and its children are gone before a second run gets the
// lock, on every backend; a normal run leaves no guardian behind.
func TestGuardian(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			t.Run("NormalExit", func(t *testing.T) { guardedExit(t, tg) })
			t.Run("Kill9", func(t *testing.T) { guardedKill(t, tg, false) })
			t.Run("Kill9IgnoringTERM", func(t *testing.T) { guardedKill(t, tg, true) })
		})
	}
}

// stderrPipe gives p a pipe for its standard error and returns a channel
// that yields what was written once every holder of the pipe closed it:
// lockctl, its guardian and COMMAND's processes.
func stderrPipe(t testing.TB, p *exec.Cmd) <-chan []byte {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.Stderr = w
	t.Cleanup(func() { w.Close(); r.Close() })
	out := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		out <- b
	}()
	return out
}

// guardedExit: COMMAND's status comes through, and the guardian is gone as
// soon as lockctl is: nothing holds lockctl's stderr after it exits.
func guardedExit(t testing.TB, tg target) {
	u := tg.url(t)
	p := exec.Command(lockctlBin, append(append([]string{"run"}, common(tg, u)...), "exit-status", "--", "sh", "-c", "exit 3")...)
	p.Env = env()
	out := stderrPipe(t, p)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.Stderr.(*os.File).Close()
	p.Wait()
	if got := p.ProcessState.ExitCode(); got != 3 {
		t.Errorf("exit %d, want COMMAND's 3", got)
	}
	exited := time.Now()
	select {
	case b := <-out:
		t.Logf("stderr closed %v after lockctl exited", time.Since(exited))
		if len(b) > 0 {
			t.Errorf("stderr of a normal run: %q", b)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("lockctl's stderr still open 2s after it exited: its guardian is left over")
	}
}

// gone tells whether pid has ended: no such process, or a zombie (the
// init of a container may never reap the orphans it inherits).
func gone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	if runtime.GOOS == "linux" {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return errors.Is(err, os.ErrNotExist)
		}
		// pid (comm) STATE ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
	}
	out, err := exec.Command("ps", "-o", "stat=", "-p", strconv.Itoa(pid)).Output()
	return err != nil || strings.HasPrefix(strings.TrimSpace(string(out)), "Z")
}

// guardedScript starts two children, records its own PID and theirs, and
// waits for them.
const guardedScript = `sleep 60 & a=$!; sleep 60 & b=$!; echo "$$ $a $b" > "$D/pids.tmp"; mv "$D/pids.tmp" "$D/pids"; wait`

// guardedKill: kill -9 of lockctl while COMMAND (with two children) runs,
// a second run for the lock started at once. COMMAND and its children are
// all seen gone before the second run's COMMAND starts, and that run gets
// the lock within the lock's life plus the store's granularity. With
// ignoreTerm the group ignores SIGTERM and --grace is long: the guardian's
// SIGKILL must still come before the lock can expire.
func guardedKill(t testing.TB, tg target, ignoreTerm bool) {
	u, dir, name := tg.url(t), t.TempDir(), "guarded"
	script := guardedScript
	if ignoreTerm {
		script = `trap '' TERM; ` + script
	}
	p := exec.Command(lockctlBin, append(append([]string{"run"}, common(tg, u)...), "--grace", "60s", name, "--", "sh", "-c", script)...)
	p.Env = env("D=" + dir)
	out := stderrPipe(t, p)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.Stderr.(*os.File).Close()
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	var pids []int
	for _, f := range strings.Fields(waitFile(t, filepath.Join(dir, "pids"), 30*time.Second)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pids: %q", f)
		}
		pids = append(pids, pid)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if len(pids) != 3 {
		t.Fatalf("pids %v, want COMMAND's and its two children's", pids)
	}
	if ignoreTerm {
		// Past the first refresh (or session contact), a third of the TTL
		// in: the guardian's deadline is the one lockctl passed on since.
		time.Sleep(tg.ttl/3 + 300*time.Millisecond)
	}

	killed := time.Now()
	p.Process.Kill()
	second := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--wait", "60s", name, "--", "sh", "-c", `: > "$D/acquired"`)...)
	second.Env = append(second.Env, "D="+dir)
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Process.Kill(); second.Wait() })
	p.Wait()

	// Each round looks at the processes, then at the second run's file:
	// processes seen gone in a round before the file appeared were gone
	// before the second run's COMMAND started.
	acquired := filepath.Join(dir, "acquired")
	within := tg.life + tg.gran + 30*time.Second
	var goneAfter time.Duration
	for {
		all := true
		for _, pid := range pids {
			all = all && gone(pid)
		}
		if _, err := os.Stat(acquired); err == nil {
			break
		}
		if all && goneAfter == 0 {
			goneAfter = time.Since(killed)
		}
		if time.Since(killed) > within {
			t.Fatalf("the second run did not acquire within %v of kill -9; stderr:\n%s", within, &second.stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(killed)
	if goneAfter == 0 {
		var alive []int
		for _, pid := range pids {
			if !gone(pid) {
				alive = append(alive, pid)
			}
		}
		t.Fatalf("the second run acquired %v after kill -9 of the first, whose COMMAND's processes %v (of %v) were not yet seen gone", took, alive, pids)
	}
	t.Logf("kill -9 of lockctl: COMMAND's group gone after %v, the second run's COMMAND ran after %v (lock life %v, granularity %v)", goneAfter, took, tg.life, tg.gran)
	// The second run polls (up to 250ms apart on backends without a queue
	// or notifications), and the machine is busy.
	if bound := tg.life + tg.gran + 1500*time.Millisecond; took > bound {
		t.Errorf("the second run acquired %v after kill -9, want within %v", took, bound)
	}
	if err := second.Wait(); err != nil {
		t.Errorf("second run: %v; stderr:\n%s", err, &second.stderr)
	}

	// The guardian said what it did, and is gone: nothing holds the first
	// lockctl's stderr any more.
	want := "sent SIGTERM to COMMAND's process group"
	select {
	case b := <-out:
		if !strings.Contains(string(b), "died holding") || !ignoreTerm && !strings.Contains(string(b), want) {
			t.Errorf("the guardian's message: %q", b)
		}
		t.Logf("the guardian: %s", bytes.TrimSpace(b))
	case <-time.After(5 * time.Second):
		t.Fatal("the killed lockctl's stderr still open 5s after the second run acquired: its guardian or COMMAND is left over")
	}
}

// guardianOf returns the PID of lockctl's guardian, a child of lockctl.
func guardianOf(t testing.TB, lockctl int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("ps", "-A", "-o", "pid=,ppid=,args=").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[1] == strconv.Itoa(lockctl) && f[2] == "lockctl-guardian" {
				pid, _ := strconv.Atoi(f[0])
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no guardian among lockctl %d's children:\n%s", lockctl, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGuardianKilled: a run whose guardian is killed says so, and goes on
// as before: COMMAND's status, the lock released.
func TestGuardianKilled(t *testing.T) {
	tg := targets()[0]
	u, dir := tg.url(t), t.TempDir()
	p := exec.Command(lockctlBin, append(append([]string{"run"}, common(tg, u)...), "guardian-killed", "--", "sh", "-c", `echo > "$D/started"; while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 4`)...)
	p.Env = env("D=" + dir)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p.Stderr = w
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	said := make(chan string, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "the guardian (pid") {
				said <- all.String()
				return
			}
		}
		said <- all.String()
	}()
	waitFile(t, filepath.Join(dir, "started"), 30*time.Second)
	if err := syscall.Kill(guardianOf(t, p.Process.Pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-said:
		if !strings.Contains(s, "the guardian (pid") {
			t.Fatalf("stderr does not report the guardian's end:\n%s", s)
		}
		t.Logf("lockctl: %s", strings.TrimSpace(s))
	case <-time.After(10 * time.Second):
		t.Fatal("no report of the guardian's end within 10s")
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if got := p.ProcessState.ExitCode(); got != 4 {
		t.Errorf("exit %d, want COMMAND's 4", got)
	}
	q := lockctlProc(append(append([]string{"run"}, common(tg, u)...), "--no-wait", "guardian-killed", "--", "true")...)
	if code, _ := q.status(t); code != 0 {
		t.Errorf("--no-wait after the run: exit %d, want 0 (released); stderr:\n%s", code, &q.stderr)
	}
}

// TestGuardianKillAtStart: kill -9 of lockctl at moments spread over its
// start, COMMAND's among them: COMMAND either never runs or is gone before
// the lock can expire. (Without the gate, a kill between COMMAND's start
// and the guardian's learning of its group left COMMAND running.)
func TestGuardianKillAtStart(t *testing.T) {
	tg := targets()[0]
	u, dir := tg.url(t), t.TempDir()
	const runs = 16
	type result struct {
		ran, alive bool
		err        string
	}
	results := make(chan result, runs)
	for i := range runs {
		go func() {
			tag := strconv.Itoa(i)
			p := exec.Command(lockctlBin, append(append([]string{"run"}, common(tg, u)...), "--grace", "60s", "start-"+tag, "--", "sh", "-c", `echo $$ > "$D/pid.$1"; exec sleep 60`, "sh", tag)...)
			p.Env = env("D=" + dir)
			if err := p.Start(); err != nil {
				results <- result{err: err.Error()}
				return
			}
			// From just after the fork to past COMMAND's start (a few ms
			// on the file backend).
			time.Sleep(time.Duration(i) * 8 * time.Millisecond)
			killed := time.Now()
			p.Process.Kill()
			p.Wait()
			// Past the lock's life: whatever runs now runs unlocked.
			time.Sleep(tg.life - time.Since(killed))
			b, err := os.ReadFile(filepath.Join(dir, "pid."+tag))
			if err != nil {
				results <- result{}
				return
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			alive := pid > 0 && !gone(pid)
			if alive {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			results <- result{ran: true, alive: alive}
		}()
	}
	ran := 0
	for range runs {
		r := <-results
		if r.err != "" {
			t.Fatal(r.err)
		}
		if r.ran {
			ran++
		}
		if r.alive {
			t.Error("COMMAND still running when the lock of the killed lockctl could expire")
		}
	}
	t.Logf("%d of %d COMMANDs had started when lockctl was killed", ran, runs)
}
