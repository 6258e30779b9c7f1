package fencetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/filelock"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testutil"
)

// The child process runs the test that started it, told by the
// environment which resource to write (childEnv) and where the resource's
// files and the locks are (dirEnv).
const (
	childEnv = "FENCETEST_CHILD"
	dirEnv   = "FENCETEST_DIR"
	// childTTL is the child's lock's TTL: its Client refreshes the lock
	// until the child is stopped.
	childTTL = 500 * time.Millisecond
	// lateWrites is how many writes the child tries once continued.
	lateWrites = 3
)

// Paused tests a guard against a holder really paused past its TTL. A
// child process (this test, run again) takes the lock, on files both
// processes share, writes through the guard, and is stopped with SIGSTOP.
// When its lock has expired in the lock store, this process takes the
// lock and writes; then the child is continued and writes lateWrites times
// more, without looking at its lock, as a process paused between a check
// of its lock and a write does. Each of those writes must be refused with
// fenced.ErrStale, the later holder's must land, and history.CheckWrites
// must pass the resource's writes. The same test with every write
// bypassing the guard must fail: the stale writes land, and the check
// catches them.
func Paused(t *testing.T, o Open) {
	for _, bypass := range []bool{false, true} {
		t.Run(map[bool]string{false: "guarded", true: "bypassed"}[bypass], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if id := os.Getenv(childEnv); id != "" {
				child(ctx, t, o, id, bypass)
				return
			}
			err := paused(ctx, t, o, bypass)
			switch {
			case !bypass && err != nil:
				t.Fatal(err)
			case bypass && err == nil:
				t.Fatal("with the guard bypassed, the test passes: it does not test the guard")
			case bypass:
				t.Logf("with the guard bypassed, the test fails, as it must:\n%v", err)
			}
		})
	}
}

// paused is the test's side of Paused: the error is the verdict on the
// guard; a failure of the test itself is fatal.
func paused(ctx context.Context, t *testing.T, o Open, bypass bool) error {
	id, dir := "p"+testutil.RandHex(4), t.TempDir()
	s := open(ctx, t, o, id, dir)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+runPattern(t.Name()), "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+id, dirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := &childOutput{t: t, r: bufio.NewReader(stdout)}

	var childFence uint64
	if _, err := fmt.Sscan(out.next("held"), &childFence); err != nil {
		t.Fatalf("child: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Granted once the stopped child's lock has expired in the store.
	l, err := files(t, dir).Acquire(ctx, resource, locker.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if l.Fence() <= childFence {
		t.Fatalf("the next holder's fence %d is not above the paused one's %d", l.Fence(), childFence)
	}
	if err := s.Write(ctx, "next-1", l.Fence(), bypass); err != nil {
		t.Fatalf("the next holder's write: %v", err)
	}
	if _, err := fmt.Fprintln(stdin, "go"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var verdict []error
	for i := 1; i <= lateWrites; i++ {
		switch got := out.next(fmt.Sprintf("wrote child-%d", i)); got {
		case "stale":
		case "ok":
			verdict = append(verdict, fmt.Errorf("the paused holder's write %d after the takeover was accepted", i))
		default:
			t.Fatalf("the paused holder's write %d: %s", i, got)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if err := s.Write(ctx, "next-2", l.Fence(), bypass); err != nil {
		t.Fatalf("the next holder's write after the paused one's: %v", err)
	}
	writes, err := s.Writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"child-0", "next-1", "next-2"} {
		if !slices.ContainsFunc(writes, func(w history.Write) bool { return w.Who == who }) {
			t.Fatalf("%s's accepted write is not in the resource: %v", who, writes)
		}
	}
	return errors.Join(append(verdict, history.CheckWrites(writes))...)
}

// child is the paused holder, in the child process.
func child(ctx context.Context, t *testing.T, o Open, id string, bypass bool) {
	dir := os.Getenv(dirEnv)
	s, _, err := o(ctx, id, dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := files(t, dir).Acquire(ctx, resource, locker.TTL(childTTL))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "child-0", l.Fence(), bypass); err != nil {
		t.Fatalf("the write while holding the lock: %v", err)
	}
	fmt.Printf("fencetest: held %d\n", l.Fence())
	// Stopped about here; continued after the next holder's write.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= lateWrites; i++ {
		res := "ok"
		switch err := s.Write(ctx, fmt.Sprintf("child-%d", i), l.Fence(), bypass); {
		case errors.Is(err, fenced.ErrStale):
			res = "stale"
		case err != nil:
			res = "error: " + err.Error()
		}
		fmt.Printf("fencetest: wrote child-%d %s\n", i, res)
	}
}

// files is a Client on the lock files under dir, which the test and its
// child share.
func files(t testing.TB, dir string) *locker.Client {
	d, err := filelock.New(filepath.Join(dir, "locks"))
	return client(t, d, err)
}

// childOutput reads the child's reports from its stdout, among the test
// framework's lines, which it keeps for the failure message.
type childOutput struct {
	t    *testing.T
	r    *bufio.Reader
	rest []string
}

// next returns what follows "fencetest: "+what on the child's next report,
// and fails the test if that report is not about what.
func (c *childOutput) next(what string) string {
	c.t.Helper()
	for {
		line, err := c.r.ReadString('\n')
		if got, ok := strings.CutPrefix(line, "fencetest: "); ok {
			if v, ok := strings.CutPrefix(got, what+" "); ok {
				return strings.TrimSpace(v)
			}
			c.t.Fatalf("child: %q, want %q", line, what)
		}
		c.rest = append(c.rest, line)
		if err != nil {
			c.t.Fatalf("child: %v before %q; it said:\n%s", err, what, strings.Join(c.rest, ""))
		}
	}
}

// runPattern is the -test.run pattern of the test named name only.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
