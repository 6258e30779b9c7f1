//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// TestOperate: status, list and release --force as separate processes on
// every backend, against a holder that is a `lockctl run` of its own.
func TestOperate(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			operate(t, tg)
		})
	}
}

// statusJSON is lockctl status --json's object.
type statusJSON struct {
	Name    string   `json:"name"`
	Held    bool     `json:"held"`
	Owner   *string  `json:"owner"`
	Fence   *uint64  `json:"fence"`
	TTLms   *int64   `json:"ttl_ms"`
	Waiters *int     `json:"waiters"`
	Queue   []string `json:"queue"`
}

func lockctlOut(t *testing.T, args ...string) (string, int, string) {
	t.Helper()
	p := lockctlProc(args...)
	var out bytes.Buffer
	p.Stdout = &out
	code, _ := p.status(t)
	return out.String(), code, p.stderr.String()
}

func operate(t *testing.T, tg target) {
	u, dir, name := tg.url(t), t.TempDir(), "ops/invoice run"
	holder, fence := startHolder(t, dir, "1", append(common(tg, u), "--owner", "billing-7", name)...)
	child := childPID(t, dir, "1")

	out, code, stderr := lockctlOut(t, "status", "--json", "--backend", u, name)
	if code != 0 {
		t.Fatalf("status of a held lock: exit %d; stderr: %s", code, stderr)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v: %q", err, out)
	}
	if !st.Held || st.Name != name {
		t.Fatalf("status --json = %s, want %q held", out, name)
	}
	if st.Fence == nil || *st.Fence != fence {
		t.Errorf("status --json fence = %v, want the holder's %d (every backend records it): %s", st.Fence, fence, out)
	}
	if st.Owner != nil && *st.Owner != "billing-7" {
		t.Errorf("status --json owner = %q, want billing-7", *st.Owner)
	}
	if st.TTLms != nil && (*st.TTLms <= 0 || time.Duration(*st.TTLms)*time.Millisecond > tg.life+tg.gran+time.Second) {
		t.Errorf("status --json ttl_ms = %d, want within (0, %v]", *st.TTLms, tg.life+tg.gran+time.Second)
	}
	t.Logf("status --json: %s", strings.TrimSpace(out))

	out, code, stderr = lockctlOut(t, "list", "--json", "--backend", u, "ops/")
	switch {
	case tg.name == "memcache":
		if code != exitUsage || !strings.Contains(stderr, "cannot enumerate") {
			t.Errorf("list on memcached: exit %d, stderr %q; want exit 2 saying it cannot enumerate", code, stderr)
		}
	case code != 0:
		t.Errorf("list: exit %d; stderr: %s", code, stderr)
	default:
		var all []statusJSON
		if err := json.Unmarshal([]byte(out), &all); err != nil || len(all) != 1 || all[0].Name != name {
			t.Errorf("list --json ops/ = %q (%v), want just %q", out, err, name)
		}
	}

	out, code, stderr = lockctlOut(t, "release", "--force", "--fence", strconv.FormatUint(fence+1, 10), "--backend", u, name)
	if code != exitFree {
		t.Errorf("release --force under a wrong fence: exit %d, want %d; out %q stderr %q", code, exitFree, out, stderr)
	}
	forced := time.Now()
	out, code, stderr = lockctlOut(t, "release", "--force", "--backend", u, name)
	if code != 0 {
		t.Fatalf("release --force: exit %d; out %q stderr %q", code, out, stderr)
	}
	if !strings.Contains(out, "fence "+strconv.FormatUint(fence, 10)) || !strings.Contains(out, "next fence") {
		t.Errorf("release --force output does not give both fences:\n%s", out)
	}
	t.Logf("release --force:\n%s", out)

	// The removed holder learns by its next refresh (or its driver's
	// watch), kills its COMMAND and exits 76.
	done := make(chan struct{})
	go func() { holder.Wait(); close(done) }()
	within := tg.life + tg.gran + 10*time.Second + 5*time.Second // TTL, the default --grace, a busy machine
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("the removed holder did not exit within %v; stderr so far:\n%s", within, &holder.stderr)
	}
	t.Logf("the removed holder exited %v after release --force", time.Since(forced))
	if got := holder.ProcessState.ExitCode(); got != exitLost {
		t.Errorf("removed holder: exit %d, want %d; stderr:\n%s", got, exitLost, &holder.stderr)
	}
	if err := syscall.Kill(child, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the removed holder's child %d is still there (kill 0: %v)", child, err)
	}
	if _, code, stderr = lockctlOut(t, "status", "--backend", u, name); code != exitFree {
		t.Errorf("status after release --force: exit %d, want %d (free); stderr %s", code, exitFree, stderr)
	}
}
