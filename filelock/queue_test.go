//go:build linux

package filelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// queueState reads key's queue: the tickets queued (dead ones included
// until someone passes over them) and whether the free lock is kept.
func queueState(t *testing.T, d *Driver, key string) (n uint64, kept bool) {
	t.Helper()
	err := d.update(context.Background(), key, false, func(r *record, now int64) (change, error) {
		n, kept = r.qtail-r.qhead, r.resvExp != 0 && now < r.resvExp
		return keep, nil
	})
	if err != nil && !errors.Is(err, errNoFile) {
		t.Fatal(err)
	}
	return n, kept
}

// waitQueued waits until key's queue holds n tickets.
func waitQueued(t *testing.T, d *Driver, key string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := queueState(t, d, key); got == n {
			return
		}
		if time.Now().After(deadline) {
			got, _ := queueState(t, d, key)
			t.Fatalf("queue of %s: %d tickets, want %d", key, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// acquire waits for c as the locker package does, through the driver's
// queue (the store never fails here): Enqueue, then Wait until the turn
// comes; a wait that ends without the lock leaves the queue.
func acquire(ctx context.Context, d *Driver, c backend.Claim) (backend.Grant, error) {
	g, t, err := d.Enqueue(ctx, c)
	if t == nil {
		return g, err
	}
	for err == nil || errors.Is(err, backend.ErrNotAcquired) {
		if g, err = t.Wait(ctx); err == nil {
			return g, nil
		}
	}
	t.Leave(context.WithoutCancel(ctx))
	return backend.Grant{}, err
}

// waiterFiles lists the directory's waiter files.
func waiterFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+waitSuffix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Waiters on two drivers (as two processes would be) and on one driver
// are served in the order they queued, and the releaser does not take
// the lock back from them; nothing is left once they are done.
func TestQueueServesInArrivalOrder(t *testing.T) {
	dir := t.TempDir()
	ctx := ctx(t)
	var ds []*Driver
	for range 2 {
		d, err := New(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	const key = "ns/fifo"
	holder := backend.Claim{Key: key, Token: "holder", TTL: time.Minute}
	if _, err := acquire(ctx, ds[0], holder); err != nil {
		t.Fatal(err)
	}
	const waiters = 6
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			d := ds[i%2]
			if i >= 4 {
				d = ds[0] // two more on one driver
			}
			c := backend.Claim{Key: key, Token: fmt.Sprint("w", i), TTL: time.Minute}
			if _, err := acquire(ctx, d, c); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			if err := d.Release(ctx, c); err != nil {
				t.Errorf("waiter %d: release: %v", i, err)
			}
		})
		waitQueued(t, ds[0], key, uint64(i+1))
	}
	if err := ds[0].Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	// The releaser comes back at once: it queues behind the others.
	if _, err := ds[0].TryAcquire(ctx, holder); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire by the releaser with waiters queued = %v, want ErrNotAcquired", err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want 0..%d", order, waiters-1)
		}
	}
	if _, err := os.Stat(ds[0].Path(key)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file after the last release: %v, want none", err)
	}
	if f := waiterFiles(t, dir); len(f) != 0 {
		t.Fatalf("waiter files left: %v", f)
	}
}

// A waiter that gives up (its context ends) leaves the queue and its
// file; one kept the free lock passes it on at once.
func TestQueueCancelledWaiterLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	ctx := ctx(t)
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const key = "ns/cancel"
	holder := backend.Claim{Key: key, Token: "holder", TTL: time.Minute}
	if _, err := acquire(ctx, d, holder); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = acquire(wctx, d, backend.Claim{Key: key, Token: "w", TTL: time.Minute})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v", err)
	}
	if n, _ := queueState(t, d, key); n != 0 {
		t.Fatalf("%d tickets queued after the waiter gave up", n)
	}
	if err := d.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path(key)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file after the release: %v, want none", err)
	}
	if f := waiterFiles(t, dir); len(f) != 0 {
		t.Fatalf("waiter files left: %v", f)
	}
}

func init() { childModes["queue"] = queueChild }

// queueChild runs in a child process (TestChild, mode "queue"): it waits
// for ns/q, says "got", holds it until its stdin closes, and releases.
func queueChild(dir string) error {
	d, err := New(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx := context.Background()
	c := backend.Claim{Key: "ns/q", Token: fmt.Sprint("child-", os.Getpid()), TTL: time.Minute}
	if _, err := acquire(ctx, d, c); err != nil {
		return err
	}
	fmt.Println("got")
	bufio.NewReader(os.Stdin).ReadString('\n')
	return d.Release(ctx, c)
}

// waitStopped waits until every thread of process pid is stopped: a
// thread may run on for a moment after kill(2) returns.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(stats) > 0
		for _, p := range stats {
			b, err := os.ReadFile(p)
			// The state follows the command, in parentheses.
			i := strings.LastIndexByte(string(b), ')')
			if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' && b[i+2] != 't' {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not stop", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

type child struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	stdin interface{ Close() error }
}

func startQueueChild(t *testing.T, ctx context.Context, dir string) *child {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=queue", "FILELOCK_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return &child{cmd: cmd, out: bufio.NewReader(out), stdin: in}
}

// A waiter killed with -9 while queued, while the free lock is kept for
// it (mid-handoff), or stopped then, holds nobody back for long: the
// next waiter gets the lock within resvGrace plus waitCap of the release,
// and the dead waiter's file is removed. A stopped one that comes back
// queues again and gets its turn.
func TestQueueKilledOrStoppedWaiter(t *testing.T) {
	for _, how := range []string{"killed", "killed-mid-handoff", "stopped"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			ctx := ctx(t)
			d, err := New(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			const key = "ns/q"
			holder := backend.Claim{Key: key, Token: "holder", TTL: time.Minute}
			if _, err := acquire(ctx, d, holder); err != nil {
				t.Fatal(err)
			}
			ch := startQueueChild(t, ctx, dir)
			waitQueued(t, d, key, 1)
			// The parent's waiter queues behind the child.
			got := make(chan time.Time, 1)
			next := backend.Claim{Key: key, Token: "next", TTL: time.Minute}
			go func() {
				if _, err := acquire(ctx, d, next); err != nil {
					t.Error(err)
				}
				got <- time.Now()
			}()
			waitQueued(t, d, key, 2)
			switch how {
			case "killed":
				ch.cmd.Process.Kill()
				ch.cmd.Wait()
			default:
				// Stopped outside any operation on the key: not holding
				// the key's flock (which would hold everyone up, as the
				// package documents), since the test holds it meanwhile.
				f, err := os.Open(d.Path(key))
				if err != nil {
					t.Fatal(err)
				}
				if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
					t.Fatal(err)
				}
				ch.cmd.Process.Signal(syscall.SIGSTOP)
				waitStopped(t, ch.cmd.Process.Pid)
				f.Close()
			}
			released := time.Now()
			if err := d.Release(ctx, holder); err != nil {
				t.Fatal(err)
			}
			if how == "killed-mid-handoff" {
				// The release kept the lock for the child, stopped: kill it.
				if _, kept := queueState(t, d, key); !kept {
					t.Fatal("the release kept the lock for nobody")
				}
				ch.cmd.Process.Kill()
				ch.cmd.Wait()
			}
			var at time.Time
			select {
			case at = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the next waiter never got the lock")
			}
			if took, limit := at.Sub(released), resvGrace+waitCap+time.Second; took > limit {
				t.Fatalf("next waiter got the lock %v after the release, want within %v", took, limit)
			}
			if how == "stopped" {
				ch.cmd.Process.Signal(syscall.SIGCONT)
				waitQueued(t, d, key, 1) // it came back and queued again
				if err := d.Release(ctx, next); err != nil {
					t.Fatal(err)
				}
				if line, err := ch.out.ReadString('\n'); err != nil || line != "got\n" {
					t.Fatalf("child: %q, %v", line, err)
				}
				ch.stdin.Close()
				if err := ch.cmd.Wait(); err != nil {
					t.Fatalf("child: %v", err)
				}
			} else if err := d.Release(ctx, next); err != nil {
				t.Fatal(err)
			}
			if f := waiterFiles(t, dir); len(f) != 0 {
				t.Fatalf("waiter files left: %v", f)
			}
			if _, err := os.Stat(d.Path(key)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("lock file after the last release: %v, want none", err)
			}
		})
	}
}

// A holder killed with -9 while others wait: the first waiter gets the
// lock when the holder's TTL runs out, with no release to wake it.
func TestQueueKilledHolder(t *testing.T) {
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
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The child holds the file's flock too: kill it first, as a holder
	// killed mid-operation, then wait.
	cmd.Process.Kill()
	cmd.Wait()
	killed := time.Now()
	g, err := acquire(ctx, d, backend.Claim{Key: "ns/crash", Token: "parent", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The child's TTL is 1s from its grant, before killed.
	if took := time.Since(killed); took > time.Second+waitCap+500*time.Millisecond || g.Fence < 2 {
		t.Fatalf("acquired %v after the kill with fence %d", took, g.Fence)
	}
}

// Through a locker.Client: 8 workers on 2 clients (two drivers, as two
// processes) queue behind a holder, then take one name 20 times each;
// each worker's count is the same within one (FIFO: a worker is served
// once per round of the others). A worker that comes back to Acquire
// more than a round (7 holds of 10ms) after its release misses a turn:
// FIFO is by arrival. 10ms rather than 2: a loaded machine may run a
// worker's way back from Release to Acquire that late, twice in 20 turns.
func TestQueueFairThroughClient(t *testing.T) {
	dir := t.TempDir()
	ctx := ctx(t)
	var cs []*locker.Client
	var ds []*Driver
	for range 2 {
		d, err := New(dir, WithSync(false))
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(d, locker.WithNamespace("fair"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs, ds = append(cs, c), append(ds, d)
	}
	start, err := cs[0].Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	const workers, total = 8, 160
	var mu sync.Mutex
	counts := make([]int, workers)
	n := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				l, err := cs[w%2].Acquire(ctx, "x")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				done := n >= total
				if !done {
					n++
					counts[w]++
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
				if done {
					return
				}
			}
		})
	}
	waitQueued(t, ds[0], backend.Key("fair", "x"), workers)
	if err := start.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	lo, hi := counts[0], counts[0]
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	if hi-lo > 1 {
		t.Fatalf("acquisitions per worker %v: want FIFO turns (within one)", counts)
	}
	if f := waiterFiles(t, dir); len(f) != 0 {
		t.Fatalf("waiter files left: %v", f)
	}
}

// A release wakes one waiter, the one it hands the lock to, however many
// wait (no herd): wake-ups counted by the drivers of 6 waiters.
func TestQueueReleaseWakesOne(t *testing.T) {
	dir := t.TempDir()
	ctx := ctx(t)
	var ds []*Driver
	for range 3 {
		d, err := New(dir, WithSync(false))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	const key = "ns/herd"
	holder := backend.Claim{Key: key, Token: "holder", TTL: time.Minute}
	if _, err := acquire(ctx, ds[0], holder); err != nil {
		t.Fatal(err)
	}
	const waiters = 6
	got := make(chan int, waiters)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range waiters {
		wg.Go(func() {
			c := backend.Claim{Key: key, Token: fmt.Sprint("w", i), TTL: time.Minute}
			if _, err := acquire(wctx, ds[i%3], c); err == nil {
				got <- i
			}
		})
		waitQueued(t, ds[0], key, uint64(i+1))
	}
	woken := func() (n uint64) {
		for _, d := range ds {
			n += d.woken.Load()
		}
		return n
	}
	before := woken()
	if err := ds[0].Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	// The first waiter took it: nobody was passed over, so nobody else
	// had a reason to be woken (the waiters' own looks, every waitCap,
	// are no wake-ups and wake nobody while the lock is held).
	if first := <-got; first != 0 {
		t.Fatalf("waiter %d got the lock first, want 0", first)
	}
	time.Sleep(20 * time.Millisecond) // time for a herd to show
	if n := woken() - before; n != 1 {
		t.Fatalf("one release woke %d waiters, want 1", n)
	}
}

// A waiting writer's ticket withdraws its record when it leaves, even once
// its driver is closed (the locker package may leave after a Close), and
// so does a lock's ticket its place.
func TestTicketLeavesAfterClose(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	other, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	reader := backend.Claim{Key: "k", Token: "r", TTL: time.Minute, Mode: backend.Read}
	holder := backend.Claim{Key: "k", Token: "h", TTL: time.Minute}
	for _, c := range []backend.Claim{reader, holder} {
		if _, err := other.TryAcquire(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	var tickets []backend.Ticket
	for _, c := range []backend.Claim{{Key: "k", Token: "w", TTL: time.Minute, Mode: backend.Write}, {Key: "k", Token: "x", TTL: time.Minute}} {
		_, tk, err := d.Enqueue(ctx, c)
		if err != nil || tk == nil {
			t.Fatalf("Enqueue(%v) = %v, %v, want a ticket", c.Mode, tk, err)
		}
		tickets = append(tickets, tk)
	}
	second := backend.Claim{Key: "k", Token: "r2", TTL: time.Minute, Mode: backend.Read}
	if _, err := other.TryAcquire(ctx, second); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a reader beside a waiting writer: %v, want ErrNotAcquired", err)
	}
	waitQueued(t, other, "k", 1)
	d.Close()
	for _, tk := range tickets {
		tk.Leave(ctx)
	}
	if _, err := other.TryAcquire(ctx, second); err != nil {
		t.Fatalf("a reader once the writer left: %v", err)
	}
	waitQueued(t, other, "k", 0)
	if f := waiterFiles(t, dir); len(f) != 0 {
		t.Fatalf("waiter files left: %v", f)
	}
}
