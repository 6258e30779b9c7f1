//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestCrashResume runs the demo against the test Redis, for the queue and
// for the locks (fair=true): two worker processes, the first SIGKILLed in
// the middle of a task. check must find nothing wrong (see its comment for
// what it verifies), w1 must have been killed in at least one task, and
// each such task must have been resumed by w2 after w1's lock was freed.
func TestCrashResume(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Setenv("LOCKER_REDIS_ADDR", testenv.RedisAddr())
	t.Setenv("LOCKER_URL", "redis://"+testenv.RedisAddr()+"/0?fair=true")
	bin := build(t)
	cfg := config{groups: 6, tasks: 10, work: 150 * time.Millisecond, prefetch: 8,
		ttl: 3 * time.Second, live: time.Second, timeout: 80 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := demo(ctx, bin, cfg, &out)
	t.Logf("\n%s", &out)
	if err != nil {
		t.Fatal(err)
	}
	rep := check(res)
	for _, p := range rep.problems {
		t.Error(p)
	}
	if len(res.killed) == 0 || len(rep.resumed) != len(res.killed) {
		t.Errorf("%d runs killed, %d resumed; want at least one, each resumed", len(res.killed), len(rep.resumed))
	}
	for _, kr := range res.killed {
		if kr.End != 0 || kr.Proc != "w1" {
			t.Errorf("killed run %+v: want one of w1's, unfinished", kr.run)
		}
	}
	if n := cfg.groups * cfg.tasks; len(res.runs) < n || res.done != int64(n) {
		t.Errorf("%d runs finished, %d tasks done; want at least %d and %d", len(res.runs), res.done, n, n)
	}
	if !strings.Contains(out.String(), "w2: ran ") {
		t.Errorf("w2 did not report its figures")
	}
}

// build compiles the command, with the race detector if this test has it.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "keyed")
	args := []string{"build", "-o", bin}
	if bi, ok := debug.ReadBuildInfo(); ok && slices.ContainsFunc(bi.Settings, func(s debug.BuildSetting) bool {
		return s.Key == "-race" && s.Value == "true"
	}) {
		args = append(args, "-race")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, gobin, append(args, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestInvalidFlags: a shape out of range is refused before any network
// call (no server is needed, and none is dialled at these addresses).
func TestInvalidFlags(t *testing.T) {
	t.Setenv("LOCKER_REDIS_ADDR", "127.0.0.1:1")
	t.Setenv("LOCKER_URL", "redis://127.0.0.1:1/0")
	ok := config{groups: 1, tasks: 1, work: time.Millisecond, prefetch: 1, ttl: time.Second, live: time.Second, timeout: time.Second}
	for _, spoil := range []func(*config){
		func(c *config) { c.groups = 0 },
		func(c *config) { c.tasks = -1 },
		func(c *config) { c.work = 0 },
		func(c *config) { c.prefetch = 0 },
		func(c *config) { c.live = time.Millisecond },
		func(c *config) { c.timeout = 0 },
		func(c *config) { c.ttl = -time.Second },
	} {
		c := ok
		spoil(&c)
		_, err := demo(context.Background(), "/nonexistent", c, io.Discard)
		if err == nil || !(errors.Is(err, errFlag) || errors.Is(err, locker.ErrInvalidTTL)) {
			t.Errorf("demo(%+v) = %v, want errFlag or locker.ErrInvalidTTL", c, err)
		}
	}
}

// TestCheckFinds feeds check histories with one fault each: it must name it.
func TestCheckFinds(t *testing.T) {
	cfg := config{groups: 1, tasks: 3}
	const key = "tenant-1/entity-1"
	ms := func(n int) int64 { return int64(n) * int64(time.Millisecond) }
	good := func() *result {
		return &result{cfg: cfg, done: 3, killedAt: ms(25), runs: []run{
			{item: item{ID: 0, Key: key, Seq: 1}, Proc: "w1", Take: 1, Fence: 10, Start: ms(0), End: ms(10)},
			{item: item{ID: 2, Key: key, Seq: 3}, Proc: "w2", Take: 1, Fence: 11, Start: ms(11), End: ms(19)},
			{item: item{ID: 1, Key: key, Seq: 2}, Proc: "w2", Take: 2, Reclaimed: true, Fence: 13, Start: ms(41), End: ms(50)},
		}, killed: []killed{{run: run{item: item{ID: 1, Key: key, Seq: 2}, Proc: "w1", Take: 2, Fence: 12, Start: ms(20)}, LastHeld: ms(40)}}}
	}
	if rep := check(good()); len(rep.problems) != 0 || len(rep.resumed) != 1 || rep.inversions != 1 {
		t.Fatalf("a good history: problems %q, resumed %q, %d inversions; want none, one, 1", rep.problems, rep.resumed, rep.inversions)
	}
	for _, c := range []struct {
		name  string
		spoil func(*result)
		want  string
	}{
		{"overlap", func(r *result) { r.runs[1].Start = ms(9) }, "before an earlier run ended"},
		{"resumed while held", func(r *result) { r.runs[2].Start = ms(39) }, "before an earlier run ended"},
		{"fence down", func(r *result) { r.runs[1].Fence = 9 }, "fence 9 (w2) after 10"},
		{"fence shared across processes", func(r *result) { r.runs[1].Fence = 10 }, "fence 10 (w2) after 10"},
		{"take order", func(r *result) { r.runs[1].Take = 3 }, "take 2 ran after take 3"},
		{"queue order", func(r *result) { r.runs[2].Reclaimed = false }, "popped task #2 ran after #3"},
		{"task missing", func(r *result) { r.runs = r.runs[:2]; r.done = 2 }, "task 1 never finished"},
		{"not resumed", func(r *result) { r.runs[2].Proc = "w1"; r.runs[2].Take = 3 }, "not resumed"},
		{"lock not seen held", func(r *result) { r.killed[0].LastHeld = ms(24) }, "never seen held after the kill"},
	} {
		r := good()
		c.spoil(r)
		rep := check(r)
		if !slices.ContainsFunc(rep.problems, func(p string) bool { return strings.Contains(p, c.want) }) {
			t.Errorf("%s: problems %q, want one saying %q", c.name, rep.problems, c.want)
		}
	}
}
