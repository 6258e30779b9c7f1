package sqlite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
)

// The child processes of the tests below run TestChild, told what to do
// by the environment: SQLITE_TEST_CHILD names the mode, SQLITE_TEST_URL
// the database.
const childEnv = "SQLITE_TEST_CHILD"

func TestChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("run by other tests in a child process")
	}
	if err := childModes[mode](os.Getenv("SQLITE_TEST_URL")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

var childModes = map[string]func(url string) error{
	// hold acquires ns/crash for 1s, prints "held FENCE SENT" (SENT: the
	// wall clock in ns before the request), and blocks.
	"hold": func(url string) error {
		ctx := context.Background()
		d, err := Open(ctx, url)
		if err != nil {
			return err
		}
		sent := time.Now()
		g, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/crash", Token: testutil.Token(), TTL: time.Second})
		if err != nil {
			return err
		}
		fmt.Printf("held %d %d\n", g.Fence, sent.UnixNano())
		time.Sleep(time.Minute)
		return errors.New("not killed")
	},
	// open prints what Open returns: "ok", or the error and whether it
	// is a permission error.
	"open": func(url string) error {
		d, err := Open(context.Background(), url)
		if err == nil {
			d.Close()
			fmt.Println("ok")
			return nil
		}
		fmt.Printf("permission=%v %v\n", errors.Is(err, backend.ErrPermission), err)
		return nil
	},
	"exclude": exclude,
}

// child starts the test binary in mode on url, with its stdout piped.
func child(ctx context.Context, t *testing.T, mode, url string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "SQLITE_TEST_URL="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewReader(out)
}

// A holder process killed with SIGKILL keeps its lock for its TTL, not
// less, then the name is free and the next fence is higher.
func TestKilledHolderFreesLock(t *testing.T) {
	t.Parallel()
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, out := child(ctx, t, "hold", url)
	line, err := out.ReadString('\n')
	var fence uint64
	var sentNS int64
	if _, serr := fmt.Sscanf(line, "held %d %d\n", &fence, &sentNS); err != nil || serr != nil {
		t.Fatalf("child: %q, %v %v", line, err, serr)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	d, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l := backend.Claim{Key: "ns/crash", Token: testutil.Token(), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, l); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire right after the kill = %v, want ErrNotAcquired (the TTL runs)", err)
	}
	sent := time.Unix(0, sentNS)
	for i := 0; ; i++ {
		g, err := d.TryAcquire(ctx, l)
		if err == nil {
			// The same host clock for both processes: the wall clock.
			got := time.Now()
			if got.Before(sent.Add(time.Second)) {
				t.Fatalf("acquired %v after the child sent its request: before its 1s TTL ran out", got.Sub(sent))
			}
			if got.After(sent.Add(3 * time.Second)) {
				t.Fatalf("acquired %v after the child sent its request: want soon after its 1s TTL", got.Sub(sent))
			}
			if g.Fence <= fence {
				t.Fatalf("fence %d after the killed holder's %d", g.Fence, fence)
			}
			return
		}
		if !errors.Is(err, backend.ErrNotAcquired) || i > 500 {
			t.Fatalf("TryAcquire %d: %v", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	excludeRounds = 40 // acquisitions per process
	excludeName   = "shared"
)

// exclude takes excludeName excludeRounds times through a Client, with
// blocking Acquire: the lock, or with SQLITE_TEST_LIMIT=n a permit of a
// semaphore of n. Inside, it takes one of n slot files with O_EXCL (so
// that an n+1st holder finds none), and for the lock appends its fence
// to the log, so that the log's order is the order of the holders.
func exclude(url string) error {
	dir := os.Getenv("SQLITE_TEST_DIR")
	limit, _ := strconv.Atoi(os.Getenv("SQLITE_TEST_LIMIT"))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, url, locker.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	log, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	opts, slots := []locker.LockOption{locker.TTL(10 * time.Second)}, 1
	if limit > 0 {
		opts, slots = append(opts, locker.Semaphore(limit)), limit
	}
	for range excludeRounds {
		l, err := c.Acquire(ctx, excludeName, opts...)
		if err != nil {
			return err
		}
		slot := ""
		for i := range slots {
			p := filepath.Join(dir, "inside-"+strconv.Itoa(i))
			if f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				f.Close()
				slot = p
				break
			}
		}
		if slot == "" {
			return fmt.Errorf("more than %d holders at once (fence %d)", slots, l.Fence())
		}
		if _, err := fmt.Fprintf(log, "%d %d\n", os.Getpid(), l.Fence()); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
		if err := os.Remove(slot); err != nil {
			return err
		}
		if err := l.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Processes sharing one file exclude each other: never two holders of
// the lock at once, fences in the order of the holders; never three
// holders of a semaphore of two.
func TestProcessesExclude(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, 2} {
		t.Run(fmt.Sprint("limit=", limit), func(t *testing.T) {
			t.Parallel()
			processesExclude(t, limit)
		})
	}
}

func processesExclude(t *testing.T, limit int) {
	dir := t.TempDir()
	url := "sqlite://" + filepath.Join(dir, "locks.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=exclude", "SQLITE_TEST_URL="+url, "SQLITE_TEST_DIR="+dir,
			"SQLITE_TEST_LIMIT="+strconv.Itoa(limit))
		wg.Go(func() {
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("child %d: %v: %s", i, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != len(errs)*excludeRounds {
		t.Fatalf("%d holds logged, want %d", len(lines), len(errs)*excludeRounds)
	}
	pids := map[string]int{}
	var last uint64
	for i, line := range lines {
		pid, f, _ := strings.Cut(line, " ")
		fence, err := strconv.ParseUint(f, 10, 64)
		if err != nil || limit == 0 && fence <= last {
			t.Fatalf("hold %d: fence %q after %d", i, f, last)
		}
		last = fence
		pids[pid]++
	}
	if len(pids) != len(errs) {
		t.Fatalf("holders by process: %v, want every process", pids)
	}
}

// Processes that open a new file at once all open it: the losers of the
// race to switch it to WAL, which SQLite answers with SQLITE_BUSY at
// once, try again (sqldb's connect). The race is rare (three processes
// of TestProcessesExclude met it once); pools of one process race so
// too (sqldb's TestSQLiteNewFileAtOnce).
func TestOpenConcurrently(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := range 3 {
		url := "sqlite://" + filepath.Join(t.TempDir(), "new.db")
		var wg sync.WaitGroup
		outs := make([]string, 4)
		for i := range outs {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"=open", "SQLITE_TEST_URL="+url)
			wg.Go(func() {
				out, err := cmd.CombinedOutput()
				outs[i] = strings.SplitN(string(out), "\n", 2)[0]
				if err != nil {
					outs[i] += " (" + err.Error() + ")"
				}
			})
		}
		wg.Wait()
		for i, out := range outs {
			if out != "ok" {
				t.Fatalf("round %d, process %d: Open = %q, want ok", round, i, out)
			}
		}
	}
}

// A database file or directory this process may not write is an error
// wrapping ErrPermission at Open. As root, which may write anything, the
// Open runs in a child process as nobody.
func TestOpenPermission(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "sqlite-perm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir+"/rodir", 0o755); os.RemoveAll(dir) })
	// A read-only directory with no database yet, and a read-only
	// database in a writable directory.
	ro, rw := filepath.Join(dir, "rodir"), filepath.Join(dir, "rw")
	for _, d := range []string{ro, rw} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	made, err := Open(context.Background(), "sqlite://"+rw+"/ro.db")
	if err != nil {
		t.Fatal(err)
	}
	made.Close()
	for _, p := range []string{rw + "/ro.db", rw + "/ro.db-wal", rw + "/ro.db-shm"} {
		if err := os.Chmod(p, 0o444); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	for _, p := range []string{ro, rw, dir} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"sqlite://" + ro + "/new.db", "sqlite://" + rw + "/ro.db"} {
		got := openAsOther(t, url)
		if !strings.HasPrefix(got, "permission=true ") {
			t.Errorf("Open(%s) = %q, want an error wrapping ErrPermission", url, got)
		}
	}
}

// openAsOther runs the child mode "open" on url: as nobody when this
// process is root, in this process otherwise.
func openAsOther(t *testing.T, url string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		d, err := Open(context.Background(), url)
		if err == nil {
			d.Close()
			return "ok"
		}
		return fmt.Sprintf("permission=%v %v", errors.Is(err, backend.ErrPermission), err)
	}
	// A copy of the test binary that nobody may run, in a directory it
	// may enter.
	tmp, err := os.MkdirTemp("", "sqlite-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	// A link, not a copy: a file this process wrote may still be open for
	// writing in a child another test is forking, and exec fails with
	// ETXTBSY while it is (Go issue 22315).
	bin := filepath.Join(tmp, "bin")
	if err := os.Link(os.Args[0], bin); err != nil {
		// Another file system: a copy, then.
		self, err := os.ReadFile(os.Args[0])
		if err == nil {
			err = os.WriteFile(bin, self, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if st, err := os.Stat(bin); err != nil || st.Mode().Perm()&0o005 != 0o005 {
		t.Fatalf("the test binary's mode does not let others run it: %v %v", st.Mode(), err)
	}
	cmd := exec.Command(bin, "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = []string{childEnv + "=open", "SQLITE_TEST_URL=" + url, "HOME=/", "TMPDIR=/tmp"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as nobody: %v: %s", err, out)
	}
	return strings.TrimSpace(strings.Split(string(out), "\n")[0])
}
