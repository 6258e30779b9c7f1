//go:build unix

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// TestCronMinHold: a job that two hosts' cron start 300 ms apart runs once
// with --no-wait --min-hold 2s, on every backend, although it ends long
// before the second start.
func TestCronMinHold(t *testing.T) {
	for _, tg := range ttlTargets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			cronMinHold(t, tg)
		})
	}
}

const minHold = 2 * time.Second

// lines starts p with its stderr on a pipe and returns a channel of its
// lines, closed when every holder of the pipe has closed it.
func lines(t testing.TB, p *exec.Cmd) <-chan string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.Stderr = w
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	out := make(chan string, 64)
	go func() {
		defer r.Close()
		defer close(out)
		s := bufio.NewScanner(r)
		for s.Scan() {
			out <- s.Text()
		}
	}()
	return out
}

func cronMinHold(t *testing.T, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "daily-email"
	ran := filepath.Join(dir, "ran")
	job := func(extra ...string) *proc {
		args := append(append([]string{"run"}, common(tg, u)...), "--no-wait", "--min-hold", minHold.String())
		args = append(append(args, extra...), name, "--", "sh", "-c", `echo ran >> "$F"; sleep 0.05`)
		p := lockctlProc(args...)
		p.Env = append(p.Env, "F="+ran)
		return p
	}

	// The first host: -v says when COMMAND has ended and the lock stays.
	first := job("-v")
	started := time.Now()
	out := lines(t, first.Cmd)
	t.Cleanup(func() { first.Process.Kill(); first.Wait() })
	var log []string
	left := false
	timeout := time.After(30 * time.Second)
	for !left {
		select {
		case l, ok := <-out:
			if !ok {
				t.Fatalf("the first run ended without saying the lock is left held:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			left = strings.Contains(l, "left held until") && strings.Contains(l, "min-hold")
		case <-timeout:
			t.Fatalf("the first run did not release within 30s:\n%s", strings.Join(log, "\n"))
		}
	}
	// Its COMMAND ran (and ended) before that, after the acquisition.
	acquired := time.Now()
	if b, _ := os.ReadFile(ran); string(b) != "ran\n" {
		t.Fatalf("after the first run's release, %s = %q", ran, b)
	}
	// A ZooKeeper lock lives with its session: lockctl stays until the
	// minimum hold has passed. Elsewhere it exits now.
	session := strings.HasPrefix(tg.name, "zk")
	if !session {
		if err := first.Wait(); err != nil {
			t.Fatalf("first run: %v\n%s", err, strings.Join(log, "\n"))
		}
	}
	time.Sleep(time.Until(started.Add(300 * time.Millisecond)))

	// The second host, 300 ms later: skipped, exit 75 (0 and silent with
	// --quiet-busy). The minimum hold runs from the first run's grant,
	// after started: a run that took the lock and ended before
	// started+minHold took it within the minimum. One that took it later
	// (a machine that ran these runs that late) proves nothing, and holds
	// the lock for a minimum of its own: the rest cannot be checked.
	held := started.Add(minHold)
	second := job()
	code, took := second.status(t)
	secondEnd := time.Now()
	runs := func() int { b, _ := os.ReadFile(ran); return strings.Count(string(b), "ran") }
	afterSecond := runs()
	quiet := job("--quiet-busy")
	qcode, _ := quiet.status(t)
	tried := time.Now()
	secondRan, quietRan := afterSecond > 1, runs() > afterSecond
	t.Logf("released %v after the first start; the others tried within %v (second took %v)",
		acquired.Sub(started), tried.Sub(started), took)
	switch {
	case secondRan && secondEnd.Before(held):
		t.Fatalf("the second run took the lock within --min-hold %v of the first's start: exit %d, stderr %q", minHold, code, &second.stderr)
	case quietRan && tried.Before(held):
		t.Fatalf("the --quiet-busy run took the lock within --min-hold %v of the first's start: exit %d, stderr %q", minHold, qcode, &quiet.stderr)
	case secondRan || quietRan:
		t.Skipf("inconclusive: the second runs ended %v after the first's start, past --min-hold %v, and one took the lock, as it then may", tried.Sub(started), minHold)
	}
	if code != exitNotAcquired || !strings.Contains(second.stderr.String(), "held by another") {
		t.Errorf("second run: exit %d, stderr %q; want %d, held by another", code, &second.stderr, exitNotAcquired)
	}
	if qcode != 0 || quiet.stderr.Len() > 0 {
		t.Errorf("second run with --quiet-busy: exit %d, stderr %q; want 0 and nothing", qcode, &quiet.stderr)
	}

	// Past the minimum hold (counted from before the release, so from
	// after the acquisition) and the store's granularity, a third run
	// acquires.
	time.Sleep(time.Until(acquired.Add(minHold + tg.gran + 100*time.Millisecond)))
	third := job()
	if code, _ := third.status(t); code != 0 {
		t.Fatalf("third run %v after the first's release: exit %d, stderr %q; want 0",
			time.Since(acquired), code, &third.stderr)
	}
	if b, _ := os.ReadFile(ran); string(b) != "ran\nran\n" {
		t.Fatalf("after the third run, %s = %q, want two lines", ran, b)
	}
	if session {
		if err := first.Wait(); err != nil {
			for l := range out { // closed: lockctl and its guardian are gone
				log = append(log, l)
			}
			t.Fatalf("first run: %v\n%s", err, strings.Join(log, "\n"))
		}
		if took := time.Since(started); took < minHold {
			t.Errorf("on a session backend the first run exited %v after its start, before its --min-hold %v", took, minHold)
		}
	}
}
