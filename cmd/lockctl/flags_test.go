//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// An empty --backend, or an empty $LOCKER_URL, is a configuration gone
// wrong: refused before anything runs, not taken for "this host only".
func TestEmptyBackendRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := `echo ran > "` + filepath.Join(dir, "ran") + `"`
	for what, c := range map[string]struct {
		args []string
		env  string
		want string
	}{
		"run --backend \"\"":          {args: []string{"run", "--backend", "", "x", "--", "sh", "-c", marker}, want: `--backend "": want a backend URL`},
		"run --backend=\" \"":         {args: []string{"run", "--backend= ", "x", "--", "sh", "-c", marker}, want: `--backend " ": want a backend URL`},
		"lockctl --backend \"\" run":  {args: []string{"--backend", "", "run", "x", "--", "sh", "-c", marker}, want: `--backend "": want a backend URL`},
		"status --backend \"\"":       {args: []string{"status", "--backend", "", "x"}, want: `--backend "": want a backend URL`},
		"list --backend \"\"":         {args: []string{"list", "--backend", ""}, want: `--backend "": want a backend URL`},
		"LOCKER_URL set, empty":       {args: []string{"run", "x", "--", "sh", "-c", marker}, env: "LOCKER_URL=", want: "LOCKER_URL is set but empty"},
		"LOCKER_URL set, blank":       {args: []string{"run", "x", "--", "sh", "-c", marker}, env: "LOCKER_URL= ", want: "LOCKER_URL is set but empty"},
		"LOCKER_URL empty, status":    {args: []string{"status", "x"}, env: "LOCKER_URL=", want: "LOCKER_URL is set but empty"},
		"--backend \"\" over a value": {args: []string{"run", "--backend", "", "x", "--", "sh", "-c", marker}, env: "LOCKER_URL=mem://", want: `--backend ""`},
	} {
		p := lockctlProc(c.args...)
		if c.env != "" {
			p.Env = append(p.Env, c.env)
		}
		code, _ := p.status(t)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d; stderr %q", what, code, exitUsage, &p.stderr)
		}
		oneLine(t, what, p.stderr.String(), c.want)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("COMMAND ran with an empty backend")
	}
}

// With no backend configured at all, lockctl locks on this host only and
// says so on stderr once; naming that store (file://) is silent.
func TestDefaultBackendSaysSo(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the default directory is under $XDG_CACHE_HOME on Linux only")
	}
	cache := t.TempDir()
	def := (&url.URL{Scheme: "file", Path: filepath.Join(cache, "lockctl")}).String()
	note := "lockctl: no --backend or LOCKER_URL: locking on this host only (" + def + ")\n"
	proc := func(env []string, args ...string) *proc {
		p := lockctlProc(args...)
		p.Env = append(p.Env, append(env, "XDG_CACHE_HOME="+cache)...)
		return p
	}

	p := proc(nil, "run", "d", "--", "true")
	if code, _ := p.status(t); code != 0 || p.stderr.String() != note {
		t.Errorf("no backend: exit %d, stderr %q; want 0 and once %q", code, &p.stderr, note)
	}
	p = proc(nil, "run", "-v", "d", "--", "true")
	if code, _ := p.status(t); code != 0 || strings.Count(p.stderr.String(), "locking on this host only") != 1 ||
		!strings.Contains(p.stderr.String(), `acquired "d" on `+def+" ") {
		t.Errorf("no backend, -v: exit %d, stderr %q; want the note once and the store in the acquisition", code, &p.stderr)
	}
	p = proc(nil, "status", "d")
	var out strings.Builder
	p.Stdout = &out
	if code, _ := p.status(t); code != exitFree || p.stderr.String() != note || !strings.Contains(out.String(), "store: "+def+"\n") {
		t.Errorf("status, no backend: exit %d, stdout %q, stderr %q; want %d, the store, the note", code, &out, &p.stderr, exitFree)
	}

	// file:// names the default directory: no note, the same locks.
	dir := t.TempDir()
	startHolder(t, dir, "1", "--backend", def, "d")
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"run", "--backend", "file://", "--no-wait", "d", "--", "true"}},
		{[]string{"LOCKER_URL=file://"}, []string{"run", "--no-wait", "d", "--", "true"}},
	} {
		p := proc(c.env, c.args...)
		code, _ := p.status(t)
		if code != exitNotAcquired || strings.Contains(p.stderr.String(), "locking on this host only") ||
			!strings.Contains(p.stderr.String(), " on "+def+": ") {
			t.Errorf("%v %v while the default store holds d: exit %d, stderr %q; want %d, no note, the store named",
				c.env, c.args, code, &p.stderr, exitNotAcquired)
		}
	}
}

// flock's short flags, bundled as getopt takes them, and durations in bare
// seconds.
func TestShortFlags(t *testing.T) {
	t.Parallel()
	u, c := fileStore(t)
	hold(t, c, "job", locker.Owner("alice"))
	rl, err := c.TryAcquire(context.Background(), "rw", locker.Read())
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Release(context.Background())

	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"-n", "job"}, exitNotAcquired},
		{[]string{"-n", "free"}, 0},
		{[]string{"-n", "-E", "3", "job"}, 3},
		{[]string{"-nE3", "job"}, 3},
		{[]string{"-nE", "4", "job"}, 4},
		{[]string{"-E", "0", "-n", "job"}, 0},
		{[]string{"--conflict-exit-code=9", "--no-wait", "job"}, 9},
		{[]string{"-w", "0.2", "job"}, exitNotAcquired},
		{[]string{"-w0.2", "-E", "5", "job"}, 5},
		{[]string{"-w", "1", "free"}, 0},
		{[]string{"--wait", "5", "free"}, 0},
		{[]string{"-s", "-n", "rw"}, 0},
		{[]string{"-x", "-n", "rw"}, exitNotAcquired},
		{[]string{"-xn", "rw"}, exitNotAcquired},
		{[]string{"-snv", "rw"}, 0},
		{[]string{"-ttl", "5", "-n", "free"}, 0},
	} {
		p := lockctlProc(append(append([]string{"run", "--backend", u}, tc.args...), "--", "true")...)
		if code, _ := p.status(t); code != tc.want {
			t.Errorf("run %v: exit %d, want %d; stderr %q", tc.args, code, tc.want, &p.stderr)
		}
	}

	// The values the flags set.
	for _, tc := range []struct {
		args []string
		want runOpts
	}{
		{[]string{"--wait", "5"}, runOpts{wait: 5 * time.Second, ttl: locker.DefaultTTL}},
		{[]string{"-w", "1.5", "--ttl", "90"}, runOpts{wait: 1500 * time.Millisecond, ttl: 90 * time.Second}},
		{[]string{"-w300ms", "--ttl", "2m"}, runOpts{wait: 300 * time.Millisecond, ttl: 2 * time.Minute}},
		{[]string{"-sxn", "--owner", "-x"}, runOpts{shared: true, exclusive: true, noWait: true, owner: "-x", ttl: locker.DefaultTTL}},
		{[]string{"-vE", "7"}, runOpts{verbose: true, busyCode: 7, ttl: locker.DefaultTTL}},
	} {
		var o runOpts
		fs := runFlags(&o, backendFlag{})
		if _, ok := fs.parse(append(tc.args, "name", "-n"), "", io.Discard, io.Discard); !ok || fs.Arg(1) != "-n" {
			t.Errorf("%v: not parsed, or past NAME", tc.args)
			continue
		}
		got := runOpts{wait: o.wait, ttl: o.ttl, shared: o.shared, exclusive: o.exclusive, noWait: o.noWait, owner: o.owner, verbose: o.verbose}
		if tc.want.busyCode == 0 {
			tc.want.busyCode = exitNotAcquired
		}
		got.busyCode = o.busyCode
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%v: parsed %+v, want %+v", tc.args, got, tc.want)
		}
	}

	// Checked before connecting: the backend cannot be reached.
	for what, c := range map[string]struct {
		args []string
		want string
	}{
		"-E out of range":     {[]string{"-n", "-E", "256"}, "-E 256: want an exit status"},
		"-E waiting forever":  {[]string{"-E", "3"}, "-E needs -n or -w"},
		"-E with quiet-busy":  {[]string{"-n", "-E", "3", "--quiet-busy"}, "exclude each other"},
		"-w not a duration":   {[]string{"-w", "5x"}, `-w "5x": want seconds`},
		"-n and -w":           {[]string{"-n", "-w", "1"}, "exclude each other"},
		"-s and -x":           {[]string{"-sx"}, "exclude each other"},
		"unknown short in -n": {[]string{"-nq"}, "unknown flag --nq"},
	} {
		args := append(append([]string{"run", "--backend", "redis://127.0.0.1:1/0", "--connect-timeout", "30s"}, c.args...), "job", "--", "true")
		code, _, stderr := ctl(args...)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d; stderr %q", what, code, exitUsage, stderr)
		}
		oneLine(t, what, stderr, c.want)
	}
	if code, _, stderr := ctl("run", "-w"); code != exitUsage {
		t.Errorf("run -w: exit %d, want %d", code, exitUsage)
	} else {
		oneLine(t, "run -w", stderr, "-w needs a value")
	}
}

// -h and --help print the command's help and every flag in GNU form on
// stdout and exit 0, for every command.
func TestHelpEveryCommand(t *testing.T) {
	t.Parallel()
	ops := []string{"--backend", "--timeout"}
	for cmd, flags := range map[string][]string{
		"":         {"--backend"},
		"run":      {"--backend", "--ttl", "-w, --wait", "-n, --no-wait", "-E, --conflict-exit-code", "--min-hold", "--lock-delay", "--limit", "--weight", "-s, --shared", "-x, --exclusive", "--quiet-busy", "--owner", "--grace", "--connect-timeout", "-v, --verbose"},
		"status":   append(ops, "--json"),
		"list":     append(ops, "--json"),
		"release":  append(ops, "--force", "--fence"),
		"doctor":   append(ops, "--json", "--ttl"),
		"backends": nil,
		"bench":    {"--backends", "--json", "--svg", "--duration", "--ttl", "--workloads"},
		"version":  {"--json"},
	} {
		for _, h := range []string{"-h", "--help"} {
			args := []string{h}
			if cmd != "" {
				args = []string{cmd, h}
			}
			code, out, errs := ctl(args...)
			if code != 0 || errs != "" || !strings.HasPrefix(out, "usage:") || !strings.Contains(out, "lockctl "+cmd) {
				t.Errorf("lockctl %v: exit %d, stderr %q, stdout %q; want 0, the usage on stdout", args, code, errs, out)
				continue
			}
			_, list, _ := strings.Cut(out, "\nFlags:\n")
			var names []string
			for _, l := range strings.Split(list, "\n") {
				if m := regexp.MustCompile(`^  (-\w, |    )(--[\w-]+)`).FindStringSubmatch(l); m != nil {
					names = append(names, strings.TrimSpace(m[1]+m[2]))
				} else if regexp.MustCompile(`^\s+-\w\w`).MatchString(l) {
					t.Errorf("lockctl %v: a long flag with one dash: %q", args, l)
				}
			}
			for _, f := range append(flags, "-h, --help") {
				if !slices.Contains(names, f) {
					t.Errorf("lockctl %v lists no %q among %q:\n%s", args, f, names, out)
				}
			}
		}
	}
}

// A busy message names the holder and the store, with -w as with -n, and
// -v names the store; neither shows a password.
func TestBusyNamesHolderAndStore(t *testing.T) {
	t.Parallel()
	u, c := fileStore(t)
	l := hold(t, c, "job", locker.Owner("alice"))
	for _, wait := range [][]string{{"--wait", "200ms"}, {"-w", "0.2"}, {"-n"}} {
		p := lockctlProc(append(append([]string{"run", "--backend", u}, wait...), "job", "--", "false")...)
		code, _ := p.status(t)
		errs := p.stderr.String()
		if code != exitNotAcquired {
			t.Errorf("%v on a held lock: exit %d, want %d", wait, code, exitNotAcquired)
		}
		for _, want := range []string{`"job" is held by another holder on ` + u + ": ", "alice", fmt.Sprintf("fence %d", l.Fence())} {
			oneLine(t, fmt.Sprint(wait), errs, want)
		}
		if wait[0] != "-n" {
			oneLine(t, fmt.Sprint(wait), errs, "(not acquired within --wait 200ms)")
		}
	}
	p := lockctlProc("run", "-v", "--backend", u, "job2", "--", "true")
	if code, _ := p.status(t); code != 0 || !strings.Contains(p.stderr.String(), `lockctl: acquired "job2" on `+u+" (fence ") {
		t.Errorf("run -v: exit %d, stderr %q, want 0 and the store in the acquisition", code, &p.stderr)
	}

	// A store with a password: named, redacted.
	testenv.Require(t, testenv.PostgresAddr())
	pg, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts local connections: any password is accepted,
	// and lockctl has one to hide.
	pw := "Canary" + uniq()
	pg.User = url.UserPassword(pg.User.Username(), pw)
	name := "busy-" + uniq()
	dir := t.TempDir()
	startHolder(t, dir, "1", "--backend", pg.String(), "--owner", "bob", name)
	for _, args := range [][]string{{"-v", "-n", name}, {"-w", "0.5", name}, {"status", name}} {
		full := append([]string{"run", "--backend", pg.String()}, args...)
		if args[0] == "status" {
			full = []string{"status", "--backend", pg.String(), name}
		} else {
			full = append(full, "--", "true")
		}
		p := lockctlProc(full...)
		var out strings.Builder
		p.Stdout = &out
		code, _ := p.status(t)
		all := out.String() + p.stderr.String()
		if strings.Contains(all, pw) {
			t.Errorf("%v shows the password: %s", args, all)
		}
		if code == 0 && args[0] != "status" || !strings.Contains(all, backend.Redacted(pg)) || !strings.Contains(all, "bob") {
			t.Errorf("%v on a lock bob holds: exit %d, output %q; want the store %s and the holder", args, code, all, backend.Redacted(pg))
		}
	}
}

// fileStore returns a file backend's URL and a Client on it: lockctl
// processes see the Client's locks.
func fileStore(t *testing.T) (string, *locker.Client) {
	t.Helper()
	u := fileURL(t)
	c, err := locker.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return u, c
}

// A URL without a scheme: lockctl shows the library's error, with whatever
// hint it gives, in one line.
func TestURLWithoutScheme(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"127.0.0.1:6379", "localhost:6379", "redis"} {
		_, lerr := locker.Open(context.Background(), raw)
		if lerr == nil {
			t.Fatalf("locker.Open(%q) succeeded", raw)
		}
		code, _, errs := ctl("run", "--backend", raw, "x", "--", "true")
		if code != exitUsage {
			t.Errorf("--backend %s: exit %d, want %d", raw, code, exitUsage)
		}
		oneLine(t, "--backend "+raw, errs, lerr.Error())
	}
}
