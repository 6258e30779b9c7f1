package faults

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testutil"
)

const quietEnv = "LOCKER_QUIET_CHILD"

// TestNothingOnStderr: no client library writes to the process's stderr
// on its own, even while a held lock's servers die under it. Each backend
// runs in a child process whose stderr must stay empty; the messages go to
// the Client's slog logger instead.
func TestNothingOnStderr(t *testing.T) {
	if os.Getenv(quietEnv) != "" {
		t.Skip("in the child")
	}
	for _, sp := range specs() {
		if strings.HasSuffix(sp.name, "-cluster") || strings.HasSuffix(sp.name, "-ensemble") || sp.name == "redis-fair" {
			continue // the same client library as a single server
		}
		t.Run(sp.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestQuietChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), quietEnv+"="+sp.name)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if err != nil || !strings.Contains(stdout.String(), "--- PASS: TestQuietChild") {
				t.Fatalf("child: %v\n%s", err, stdout.String())
			}
			if stderr.Len() > 0 {
				t.Errorf("the %s client wrote to stderr on its own:\n%s", sp.name, stderr.String())
			}
			t.Logf("child:\n%s", stdout.String())
		})
	}
}

// TestQuietChild takes a lock on private servers, kills them, waits for
// the loss and closes: the client libraries' reconnect messages must all
// reach the logger.
func TestQuietChild(t *testing.T) {
	name := os.Getenv(quietEnv)
	if name == "" {
		t.Skip("run by TestNothingOnStderr")
	}
	var sp spec
	for _, s := range specs() {
		if s.name == name {
			sp = s
		}
	}
	servers := sp.start(t)
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr)
	}
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, sp.url(servers, addrs), locker.WithLogger(log), locker.WithDefaultTTL(sp.ttl))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, "quiet") // waits out a fresh server's restart delay
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the lock was not lost within 30s of its servers' death")
	}
	// A new acquisition while the servers are down makes the libraries dial.
	tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
	c.TryAcquire(tctx, "quiet-2")
	tcancel()
	if err := c.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	t.Logf("%d log lines reached the logger", strings.Count(logs.String(), "\n"))
}
