//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// Schemes on memlock's named stores that hide its operator interfaces, for
// the paths of backends without them: memplain:// has none, meminspect://
// has Inspect only.
type plainDriver struct{ backend.Driver }

type inspectOnly struct {
	plainDriver
	backend.Inspector
}

func init() {
	open := func(keepInspect bool) func(context.Context, *url.URL) (backend.Driver, error) {
		return func(_ context.Context, u *url.URL) (backend.Driver, error) {
			d, err := memlock.New(memlock.Named(u.Host))
			if err != nil {
				return nil, err
			}
			if keepInspect {
				return inspectOnly{plainDriver{d}, d}, nil
			}
			return plainDriver{d}, nil
		}
	}
	backend.Register("memplain", backend.Opener{Usage: "memplain://NAME (tests)", Open: open(false)})
	backend.Register("meminspect", backend.Opener{Usage: "meminspect://NAME (tests)", Open: open(true)})
}

// memStore returns the name of a fresh memlock store and a Client on it,
// as lockctl's mem://NAME opens it.
func memStore(t *testing.T) (string, *locker.Client) {
	t.Helper()
	store := "ops-" + testutil.RandHex(6)
	c, err := locker.Open(context.Background(), "mem://"+store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return store, c
}

func hold(t *testing.T, c *locker.Client, name string, opts ...locker.LockOption) *locker.Lock {
	t.Helper()
	l, err := c.TryAcquire(context.Background(), name, opts...)
	if err != nil {
		t.Fatalf("acquire %q: %v", name, err)
	}
	t.Cleanup(func() { l.Release(context.Background()) })
	return l
}

// hostname is the host part of a Client's default label.
func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// ctl runs lockctl in-process.
func ctl(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = lockctl(args, &out, &errb)
	return code, out.String(), errb.String()
}

// oneLine checks that msg is one line from lockctl that contains want.
func oneLine(t *testing.T, what, msg, want string) {
	t.Helper()
	msg = strings.TrimSuffix(msg, "\n")
	if !strings.HasPrefix(msg, "lockctl") || strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
		t.Errorf("%s: stderr %q, want one line from lockctl saying %q", what, msg, want)
	}
}

func jsonObject(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not one JSON object: %v: %q", err, s)
	}
	return m
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestStatus(t *testing.T) {
	t.Parallel()
	store, c := memStore(t)
	u := "mem://" + store
	l := hold(t, c, "invoice run", locker.Label("worker-7"), locker.TTL(30*time.Second))

	code, out, errs := ctl("status", "--backend", u, "invoice run")
	if code != 0 || errs != "" {
		t.Fatalf("status of a held lock: exit %d, stderr %q; want 0", code, errs)
	}
	for _, want := range []string{`"invoice run": held`, "owner:     worker-7", fmt.Sprintf("fence:     %d", l.Fence()), "time left: ", "waiters:   unknown"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if m := regexp.MustCompile(`time left: (\S+)`).FindStringSubmatch(out); m == nil {
		t.Errorf("no time left in:\n%s", out)
	} else if d, err := time.ParseDuration(m[1]); err != nil || d <= 25*time.Second || d > 30*time.Second {
		t.Errorf("time left %q, want within (25s, 30s] of a 30s TTL", m[1])
	}

	// --json, after NAME too: name, held and the fields memlock records.
	code, out, _ = ctl("--backend", u, "status", "invoice run", "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d", code)
	}
	m := jsonObject(t, out)
	if got, want := keys(m), []string{"fence", "held", "name", "owner", "ttl_ms"}; !slices.Equal(got, want) {
		t.Errorf("status --json fields %v, want %v (memlock records no queue)", got, want)
	}
	if m["name"] != "invoice run" || m["held"] != true || m["owner"] != "worker-7" || m["fence"] != float64(l.Fence()) {
		t.Errorf("status --json = %s", out)
	}
	if ms, _ := m["ttl_ms"].(float64); ms <= 25000 || ms > 30000 {
		t.Errorf("ttl_ms = %v, want within (25000, 30000]", m["ttl_ms"])
	}

	// A holder that gave no label: the Client's default, host and process.
	hold(t, c, "by-default")
	if _, out, _ := ctl("status", "--backend", u, "by-default"); !strings.Contains(out, fmt.Sprintf("owner:     %s:%d", hostname(t), os.Getpid())) {
		t.Errorf("status of a holder with the default label:\n%s", out)
	}
	// A holder with an empty label: known, and empty.
	hold(t, c, "anon", locker.Label(""))
	if _, out, _ := ctl("status", "--backend", u, "anon"); !strings.Contains(out, "owner:     (none given)") {
		t.Errorf("status of an ownerless holder:\n%s", out)
	}
	if _, out, _ := ctl("status", "--backend", u, "--json", "anon"); jsonObject(t, out)["owner"] != "" {
		t.Errorf("status --json of an ownerless holder: %s, want owner \"\"", out)
	}

	// Free: exit 1, and only name and held.
	code, out, errs = ctl("status", "--backend", u, "nobody")
	if want := "nobody: free\n  store: " + u + "\n"; code != exitFree || out != want || errs != "" {
		t.Errorf("status of a free lock: exit %d, stdout %q, stderr %q; want %d, %q", code, out, errs, exitFree, want)
	}
	code, out, _ = ctl("status", "--backend", u, "--json", "nobody")
	if code != exitFree {
		t.Errorf("status --json of a free lock: exit %d, want %d", code, exitFree)
	}
	if m := jsonObject(t, out); !slices.Equal(keys(m), []string{"held", "name"}) || m["held"] != false {
		t.Errorf("status --json of a free lock = %s, want name and held false only", out)
	}

	// A backend without Inspect.
	code, out, errs = ctl("status", "--backend", "memplain://"+store, "invoice run")
	if code != exitUsage || out != "" {
		t.Errorf("status on a backend without Inspect: exit %d, stdout %q; want %d", code, out, exitUsage)
	}
	oneLine(t, "status without Inspect", errs, "the memplain backend cannot read a lock's state")
}

func TestList(t *testing.T) {
	t.Parallel()
	store, c := memStore(t)
	u := "mem://" + store
	a1 := hold(t, c, "jobs/a", locker.Label("worker-1"))
	a2 := hold(t, c, "jobs/b-with-a-long-name")
	hold(t, c, "other", locker.Label("x"))

	code, out, errs := ctl("list", "--backend", u, "jobs/")
	if code != 0 || errs != "" {
		t.Fatalf("list: exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME ") ||
		!strings.HasPrefix(lines[1], "jobs/a ") || !strings.HasPrefix(lines[2], "jobs/b-with-a-long-name ") {
		t.Fatalf("list jobs/ =\n%s\nwant a header, jobs/a, jobs/b-with-a-long-name", out)
	}
	// Aligned: each column starts where its header does.
	for _, h := range []string{"OWNER", "FENCE", "TIME LEFT"} {
		at := strings.Index(lines[0], h)
		for _, line := range lines[1:] {
			if len(line) <= at || line[at-1] != ' ' || line[at] == ' ' {
				t.Errorf("column %s (at %d) not aligned:\n%s", h, at, out)
			}
		}
	}
	f1 := strings.Fields(lines[1])
	f2 := strings.Fields(lines[2])
	if f1[1] != "worker-1" || f1[2] != strconv.FormatUint(a1.Fence(), 10) ||
		f2[1] != show(fmt.Sprintf("%s:%d", hostname(t), os.Getpid())) || !strings.Contains(lines[2], " "+strconv.FormatUint(a2.Fence(), 10)+" ") {
		t.Errorf("list rows:\n%s", out)
	}

	code, out, _ = ctl("list", "--backend", u, "--json")
	var all []map[string]any
	if err := json.Unmarshal([]byte(out), &all); err != nil || code != 0 {
		t.Fatalf("list --json: exit %d, %v: %q", code, err, out)
	}
	if len(all) != 3 || all[0]["name"] != "jobs/a" || all[2]["name"] != "other" || all[0]["owner"] != "worker-1" {
		t.Errorf("list --json = %s", out)
	}
	for _, m := range all {
		if got := keys(m); !slices.Equal(got, []string{"fence", "held", "name", "owner", "ttl_ms"}) {
			t.Errorf("list --json element fields %v", got)
		}
	}

	// None: an empty array, or nothing on stdout and a note on stderr.
	if code, out, _ := ctl("list", "--backend", u, "--json", "zzz"); code != 0 || out != "[]\n" {
		t.Errorf("list --json with no match: exit %d, %q; want 0, []", code, out)
	}
	if code, out, errs := ctl("list", "--backend", u, "zzz"); code != 0 || out != "" || !strings.Contains(errs, `no held locks with prefix "zzz"`) {
		t.Errorf("list with no match: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// Backends that cannot enumerate.
	for _, scheme := range []string{"memplain", "meminspect"} {
		code, out, errs := ctl("list", "--backend", scheme+"://"+store)
		if code != exitUsage || out != "" {
			t.Errorf("list on %s: exit %d, stdout %q; want %d", scheme, code, out, exitUsage)
		}
		oneLine(t, "list on "+scheme, errs, "the "+scheme+" backend cannot enumerate its locks")
	}
}

func TestReleaseForce(t *testing.T) {
	// Not parallel: it sets releaseHook.
	store, c := memStore(t)
	u := "mem://" + store
	ctx := context.Background()
	l := hold(t, c, "stuck", locker.Label("batch-7"), locker.TTL(3*time.Second))
	fence := strconv.FormatUint(l.Fence(), 10)

	// --fence that is not the holder's: nothing changes.
	code, out, _ := ctl("release", "--backend", u, "--force", "stuck", "--fence", strconv.FormatUint(l.Fence()+1, 10))
	if code != exitFree || !strings.Contains(out, "held under fence "+fence) || !strings.Contains(out, "nothing changed") {
		t.Errorf("release --force --fence mismatch: exit %d, stdout %q; want %d", code, out, exitFree)
	}
	if s, err := c.Inspect(ctx, "stuck"); err != nil || !s.Held || s.Fence != l.Fence() {
		t.Fatalf("after a refused release: %+v, %v; want the holder kept", s, err)
	}

	code, out, errs := ctl("release", "--backend", u, "--force", "--fence", fence, "stuck")
	if code != 0 || errs != "" {
		t.Fatalf("release --force: exit %d, stderr %q", code, errs)
	}
	m := regexp.MustCompile(`removed the holder with owner "batch-7", fence (\d+)\n(?s:.*)next fence: (\d+) \(taken by lockctl-release-probe`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("release --force output:\n%s", out)
	}
	if !strings.Contains(out, "learns of the loss by its next refresh") {
		t.Errorf("release --force does not say when the holder learns of it:\n%s", out)
	}
	removed, _ := strconv.ParseUint(m[1], 10, 64)
	next, _ := strconv.ParseUint(m[2], 10, 64)
	if removed != l.Fence() || next <= removed {
		t.Errorf("fences: removed %d (holder's %d), next %d: want the holder's, then a greater one", removed, l.Fence(), next)
	}
	// The probe released at once; the removed holder's refresh finds the loss.
	if s, err := c.Inspect(ctx, "stuck"); err != nil || s.Held {
		t.Errorf("after release --force: %+v, %v; want free (the probe released)", s, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatalf("the removed holder's Lost did not close within 10s (TTL 3s)")
	}

	// Free now: exit 1.
	if code, out, _ := ctl("release", "--backend", u, "--force", "stuck"); code != exitFree || out != "stuck is free on "+u+": nothing to release\n" {
		t.Errorf("release --force of a free lock: exit %d, %q", code, out)
	}

	// A waiter takes the lock before the probe: its fence is reported.
	l2 := hold(t, c, "stuck", locker.Label("batch-8"))
	var waiter *locker.Lock
	releaseHook = func(stage string) {
		if stage == "removed" {
			waiter = hold(t, c, "stuck", locker.Label("waiter"))
		}
	}
	defer func() { releaseHook = nil }()
	code, out, errs = ctl("release", "--backend", u, "--force", "stuck")
	releaseHook = nil
	if code != 0 || waiter == nil {
		t.Fatalf("release --force with a waiter: exit %d, stderr %q", code, errs)
	}
	want := fmt.Sprintf("next fence: %d (a waiter took the lock: owner \"waiter\", fence %d)", waiter.Fence(), waiter.Fence())
	if !strings.Contains(out, want) || waiter.Fence() <= l2.Fence() {
		t.Errorf("release --force with a waiter:\n%s\nwant %q above %d", out, want, l2.Fence())
	}

	// The holder changes between Inspect and the removal: it is kept.
	var l4 *locker.Lock
	releaseHook = func(stage string) {
		if stage == "inspected" {
			waiter.Release(ctx)
			l4 = hold(t, c, "stuck", locker.Label("new"))
		}
	}
	code, out, _ = ctl("release", "--backend", u, "--force", "stuck")
	releaseHook = nil
	if code != exitFree || !strings.Contains(out, "changed hands") {
		t.Errorf("release --force when the holder changed: exit %d, %q; want %d", code, out, exitFree)
	}
	if s, err := c.Inspect(ctx, "stuck"); err != nil || !s.Held || s.Fence != l4.Fence() {
		t.Errorf("the new holder: %+v, %v; want it kept (fence %d)", s, err, l4.Fence())
	}

	// Backends without Inspect or without ForceRelease: refused, unchanged.
	for scheme, want := range map[string]string{
		"memplain":   "the memplain backend cannot read a lock's state",
		"meminspect": "the meminspect backend cannot remove another client's lock",
	} {
		code, out, errs := ctl("release", "--backend", scheme+"://"+store, "--force", "stuck")
		if code != exitUsage {
			t.Errorf("release --force on %s: exit %d, stdout %q; want %d", scheme, code, out, exitUsage)
		}
		oneLine(t, "release --force on "+scheme, errs, want)
	}
	if s, err := c.Inspect(ctx, "stuck"); err != nil || !s.Held || s.Fence != l4.Fence() {
		t.Errorf("after refused releases: %+v, %v; want the holder kept", s, err)
	}
}

// Bad input exits 2 before any network call: the backend is a server that
// cannot be reached, and the error is about the input.
func TestOpsBadInput(t *testing.T) {
	t.Parallel()
	const dead = "redis://127.0.0.1:1/0"
	for what, c := range map[string]struct {
		args []string
		want string
	}{
		"status: no name":         {[]string{"status"}, "missing NAME"},
		"status: two names":       {[]string{"status", "a", "b"}, `"b" after NAME`},
		"status: empty name":      {[]string{"status", ""}, "NAME: "},
		"status: invalid UTF-8":   {[]string{"status", "a\xffb"}, "NAME: "},
		"status: name too long":   {[]string{"status", strings.Repeat("x", 257)}, "NAME: "},
		"status: unknown flag":    {[]string{"status", "--frob", "a"}, "frob"},
		"status: bad timeout":     {[]string{"status", "--timeout", "0s", "a"}, "--timeout"},
		"list: two prefixes":      {[]string{"list", "a", "b"}, `"b" after PREFIX`},
		"list: bad prefix":        {[]string{"list", "a\x00"}, "PREFIX"},
		"release: no --force":     {[]string{"release", "a"}, "a lock is released by its holder"},
		"release: no name":        {[]string{"release", "--force"}, "missing NAME"},
		"release: bad --fence":    {[]string{"release", "--force", "--fence", "x", "a"}, `--fence "x"`},
		"release: negative fence": {[]string{"release", "--force", "a", "--fence", "-1"}, `--fence "-1"`},
		"release: invalid name":   {[]string{"release", "--force", "a\xffb"}, "NAME: "},
		"version: argument":       {[]string{"version", "x"}, "takes no arguments"},
	} {
		args := append([]string{"--backend", dead}, c.args...)
		code, out, errs := ctl(args...)
		if code != exitUsage || out != "" {
			t.Errorf("%s: exit %d, stdout %q; want %d", what, code, out, exitUsage)
		}
		oneLine(t, what, errs, c.want)
	}
	// Names after "--" may start with '-'.
	store, c := memStore(t)
	hold(t, c, "-dash")
	if code, out, errs := ctl("status", "--backend", "mem://"+store, "--", "-dash"); code != 0 {
		t.Errorf("status -- -dash: exit %d, %q %q", code, out, errs)
	}
	// Help: exit 0.
	for _, cmd := range []string{"status", "list", "release", "version"} {
		if code, out, _ := ctl(cmd, "-h"); code != 0 || !strings.Contains(out, "usage: lockctl "+cmd) {
			t.Errorf("%s -h: exit %d, %q", cmd, code, out)
		}
	}
}

func TestNoWaitNamesHolder(t *testing.T) {
	t.Parallel()
	store, c := memStore(t)
	l := hold(t, c, "job", locker.Label("alice"))
	code, _, errs := ctl("run", "--backend", "mem://"+store, "--no-wait", "job", "--", "false")
	want := fmt.Sprintf(`lockctl: "job" is held by another holder on mem://%s: owner "alice", fence %d (--no-wait)`+"\n", store, l.Fence())
	if code != exitNotAcquired || errs != want {
		t.Errorf("run --no-wait on a held lock: exit %d, stderr %q; want %d, %q", code, errs, exitNotAcquired, want)
	}
	// Without Inspect: the message of old.
	code, _, errs = ctl("run", "--backend", "memplain://"+store, "--no-wait", "job", "--", "false")
	if want := `lockctl: "job" is held by another holder on memplain://` + store + ` (--no-wait)` + "\n"; code != exitNotAcquired || errs != want {
		t.Errorf("run --no-wait without Inspect: exit %d, stderr %q; want %d, %q", code, errs, exitNotAcquired, want)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, errs := ctl("version")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "lockctl ") || strings.Count(out, "\n") != 1 ||
		!strings.Contains(out, runtime.Version()) {
		t.Errorf("version: exit %d, %q, stderr %q; want one line with %s", code, out, errs, runtime.Version())
	}
	code, out, _ = ctl("version", "--json")
	m := jsonObject(t, out)
	for _, k := range []string{"version", "go", "platform"} {
		if s, _ := m[k].(string); s == "" || code != 0 {
			t.Errorf("version --json: exit %d, %q lacks %q", code, out, k)
		}
	}
	if m["go"] != runtime.Version() {
		t.Errorf("version --json go = %v, want %s", m["go"], runtime.Version())
	}
}
