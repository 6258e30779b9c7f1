//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/lockerhq/locker"
)

// TestCronFlagsBadInput: --min-hold and --quiet-busy are checked before
// connecting (the backend here cannot be reached): exit 2, one line.
func TestCronFlagsBadInput(t *testing.T) {
	const dead = "redis://127.0.0.1:1/0"
	for what, c := range map[string]struct {
		args []string
		want string
	}{
		"negative min-hold":           {[]string{"--min-hold", "-1s", "--no-wait"}, "--min-hold -1s"},
		"min-hold past MaxTTL":        {[]string{"--min-hold", (locker.MaxTTL + 1).String()}, "--min-hold"},
		"min-hold not a duration":     {[]string{"--min-hold", "5x"}, "--min-hold \"5x\": want seconds"},
		"quiet-busy, waiting forever": {[]string{"--quiet-busy"}, "--quiet-busy needs --no-wait or --wait"},
		"negative limit":              {[]string{"--limit", "-1"}, "--limit -1"},
		"limit past MaxLimit":         {[]string{"--limit", "10001"}, "--limit 10001: want 1 to 10000"},
		"shared and exclusive":        {[]string{"--shared", "--exclusive"}, "exclude each other"},
		"limit and shared":            {[]string{"--limit", "2", "--shared"}, "exclude each other"},
		"weight without limit":        {[]string{"--weight", "2"}, "--weight 2 needs --limit"},
		"weight past limit":           {[]string{"--limit", "3", "--weight", "4"}, "--weight 4: want 1 to --limit 3"},
		"negative weight":             {[]string{"--limit", "3", "--weight", "-1"}, "--weight -1"},
	} {
		args := append(append([]string{"run", "--backend", dead, "--connect-timeout", "30s"}, c.args...), "job", "--", "true")
		code, _, stderr := ctl(args...)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d; stderr %q", what, code, exitUsage, stderr)
		}
		oneLine(t, what, stderr, c.want)
	}
	// Valid: MaxTTL itself, 0 (none), --quiet-busy with --wait. What
	// fails then is the connection, after validation.
	for _, args := range [][]string{
		{"--min-hold", locker.MaxTTL.String(), "--no-wait"},
		{"--min-hold", "0", "--quiet-busy", "--wait", "1s"},
	} {
		code, _, stderr := ctl(append(append([]string{"run", "--backend", dead, "--connect-timeout", "1s"}, args...), "job", "--", "true")...)
		if code != exitUsage || strings.Contains(stderr, "-min-hold") || strings.Contains(stderr, "-quiet-busy") {
			t.Errorf("%v: exit %d, stderr %q; want the connection to fail, not the flags", args, code, stderr)
		}
	}
}

// TestQuietBusy: with --quiet-busy a lock another holder has makes run exit
// 0 and print nothing; without it, 75 as before.
func TestQuietBusy(t *testing.T) {
	store, c := memStore(t)
	u := "mem://" + store
	hold(t, c, "job")
	for _, args := range [][]string{{"--no-wait"}, {"--wait", "200ms"}} {
		code, _, stderr := ctl(append(append([]string{"run", "--backend", u, "--quiet-busy"}, args...), "job", "--", "false")...)
		if code != 0 || stderr != "" {
			t.Errorf("--quiet-busy %v on a held lock: exit %d, stderr %q; want 0, nothing", args, code, stderr)
		}
		code, _, stderr = ctl(append(append([]string{"run", "--backend", u}, args...), "job", "--", "false")...)
		if code != exitNotAcquired || stderr == "" {
			t.Errorf("%v on a held lock: exit %d, stderr %q; want %d and a message", args, code, stderr, exitNotAcquired)
		}
	}
}

// TestRunUsageExitCodes: run -h lists the exit statuses and the new flags.
func TestRunUsageExitCodes(t *testing.T) {
	code, help, _ := ctl("run", "-h")
	if code != 0 {
		t.Fatalf("run -h: exit %d", code)
	}
	for _, want := range []string{"--quiet-busy", "75 ", "76 ", "127 ", "128+N", "2 ", "--min-hold", "session_timeout"} {
		if !strings.Contains(help, want) {
			t.Errorf("run -h does not mention %q:\n%s", want, help)
		}
	}
}
