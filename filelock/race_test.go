//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filelock

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

	"github.com/lockerhq/locker/backend"
)

// The child processes of the tests below run this test, told what to do by
// the environment.
const childEnv = "FILELOCK_TEST_CHILD"

// childModes are more things a child can be told to do, on a directory.
var childModes = map[string]func(dir string) error{}

func TestChild(t *testing.T) {
	if run := childModes[os.Getenv(childEnv)]; run != nil {
		if err := run(os.Getenv("FILELOCK_DIR")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	switch os.Getenv(childEnv) {
	case "":
		t.Skip("run by other tests in a child process")
	case "race":
		if err := raceChild(os.Getenv("FILELOCK_DIR"), os.Getenv("FILELOCK_LOG")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "hold":
		d, err := New(os.Getenv("FILELOCK_DIR"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if _, err := d.TryAcquire(context.Background(), backend.Claim{Key: "ns/crash", Token: "child", TTL: time.Second}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		// Also hold the flock of the name's file, as a process killed in
		// the middle of an operation would.
		f, err := os.Open(d.Path("ns/crash"))
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("held")
		time.Sleep(time.Minute)
		os.Exit(1)
	}
}

const (
	raceWorkers = 4  // goroutines per process, each with its own driver
	raceRounds  = 40 // acquisitions per goroutine
)

// raceChild takes one name raceRounds times in each of raceWorkers
// goroutines, as fast as it can. While it holds the name it checks that no
// one else is inside (a marker file made with O_EXCL) and appends its fence
// to the log, so that the log's order is the order of the holders.
func raceChild(dir, logPath string) error {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer logf.Close()
	marker := logPath + ".inside"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, raceWorkers)
	for w := range raceWorkers {
		wg.Go(func() {
			d, err := New(dir, WithSync(false))
			if err != nil {
				errs <- err
				return
			}
			defer d.Close()
			for got := 0; got < raceRounds; {
				l := backend.Claim{Key: "ns/race", Token: fmt.Sprintf("%d-%d-%d", os.Getpid(), w, got), TTL: time.Minute}
				g, err := d.TryAcquire(ctx, l)
				if errors.Is(err, backend.ErrNotAcquired) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				m, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if err != nil {
					errs <- fmt.Errorf("two holders at once (fence %d): %w", g.Fence, err)
					return
				}
				m.Close()
				_, err = fmt.Fprintf(logf, "%d\n", g.Fence)
				if rerr := os.Remove(marker); err == nil {
					err = rerr
				}
				if err == nil {
					err = d.Release(ctx, l)
				}
				if err != nil {
					errs <- err
					return
				}
				got++
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Several processes, several goroutines each with their own descriptors,
// race for one name whose file every release removes: a process that
// opened the file and got its flock after a release removed it must open
// the path again, or two would hold the name at once. The holders never
// overlap, and their fences increase in the order they held it.
func TestRemovedFileRace(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(logPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const procs = 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	for range procs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=race", "FILELOCK_DIR="+dir, "FILELOCK_LOG="+logPath)
		cmd.Stderr = &strings.Builder{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child: %v: %s", err, cmd.Stderr)
		}
	}
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fences []uint64
	for sc := bufio.NewScanner(f); sc.Scan(); {
		n, err := strconv.ParseUint(sc.Text(), 10, 64)
		if err != nil {
			t.Fatalf("log line %q", sc.Text())
		}
		fences = append(fences, n)
	}
	if want := procs * raceWorkers * raceRounds; len(fences) != want {
		t.Fatalf("%d acquisitions logged, want %d", len(fences), want)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("holder %d got fence %d after %d", i, fences[i], fences[i-1])
		}
	}
	if n, err := (harness{dir: dir}).Residue(ctx, "ns/race"); err != nil || n != 0 {
		t.Fatalf("Residue after the last release = %d, %v, want 0", n, err)
	}
}

// A holder killed with SIGKILL, in the middle of an operation (it holds the
// file's flock) or not, frees the name when its TTL runs out.
func TestKilledHolderFreesLock(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=hold", "FILELOCK_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		cmd.Process.Kill()
		t.Fatalf("child: %q, %v", line, err)
	}
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l := backend.Claim{Key: "ns/crash", Token: "parent", TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, l); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire right after the kill = %v, want ErrNotAcquired (the TTL runs)", err)
	}
	for {
		g, err := d.TryAcquire(ctx, l)
		if err == nil {
			if took := time.Since(killed); took > 2*time.Second || g.Fence < 2 {
				t.Fatalf("acquired %v after the kill with fence %d: want within the 1s TTL and a fence above the child's", took, g.Fence)
			}
			break
		}
		if !errors.Is(err, backend.ErrNotAcquired) || ctx.Err() != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An acquirer that opened a name's file and got its flock only after the
// file was removed opens the path again rather than take the lock in a
// file no one else sees. The file here is an empty one that its maker
// removed (an acquisition that failed after creating it); a released
// file still shows its last holder, so it never looks free.
func TestAcquireAfterRemovalReopens(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc/self/fd to see the acquirer's descriptor")
	}
	// Removed, or removed and made again by someone else (another inode).
	for _, replaced := range []bool{false, true} {
		t.Run(fmt.Sprint("replaced=", replaced), func(t *testing.T) { acquireAfterRemoval(t, replaced) })
	}
}

func acquireAfterRemoval(t *testing.T, replaced bool) {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := d.Path("ns/gone")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/gone", Token: "a", TTL: time.Minute})
		done <- err
	}()
	// Wait until the acquirer has the file open (and waits for its flock).
	for opened := false; !opened; {
		if ctx.Err() != nil {
			t.Fatal("the acquirer never opened the file")
		}
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, e := range fds {
			if fd, _ := strconv.Atoi(e.Name()); uintptr(fd) != f.Fd() {
				if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == path {
					opened = true
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if replaced {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.Close() // drops the flock
	if err := <-done; err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if h, err := d.Inspect(ctx, "ns/gone", backend.Exclusive); err != nil || !h.Held {
		t.Fatalf("Inspect after the acquisition = %+v, %v: the lock is not in the name's file", h, err)
	}
}
