//go:build unix

package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/lockerhq/locker/internal/testenv"
)

// doctor's exit status is the worst finding's level: 2 for a Redis that
// may evict lock keys, with the line that says why and the fix; --json
// gives the same findings.
func TestDoctor(t *testing.T) {
	t.Parallel()
	evicting := testenv.StartRedisWith(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
	u := "redis://" + evicting.Addr
	out, code, stderr := lockctlOut(t, "doctor", "--backend", u)
	if code != 2 || !strings.Contains(out, "unsafe  redis.maxmemory-policy") || !strings.Contains(out, "Fix: CONFIG SET maxmemory-policy noeviction") {
		t.Fatalf("doctor on an evicting server: exit %d, want 2 and the finding; stdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	out, code, _ = lockctlOut(t, "doctor", "--json", "--backend", u)
	var rep struct {
		Level    string `json:"level"`
		Findings []struct {
			Check string `json:"check"`
			Level int    `json:"level"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 2 || rep.Level != "unsafe" || len(rep.Findings) == 0 {
		t.Fatalf("--json: exit %d, %v, %+v:\n%s", code, err, rep, out)
	}
	// A lock directory every user may write: a warning, exit 1.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if out, code, _ := lockctlOut(t, "doctor", "--backend", "file://"+dir); code != 1 || !strings.Contains(out, "warning file.permissions") {
		t.Fatalf("doctor on a world-writable directory: exit %d, want 1; stdout:\n%s", code, out)
	}
	if _, code, stderr := lockctlOut(t, "doctor", "--backend", u, "extra"); code != exitUsage || !strings.Contains(stderr, "takes no arguments") {
		t.Fatalf("doctor with an argument: exit %d; %s", code, stderr)
	}
}
