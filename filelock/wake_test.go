//go:build linux

package filelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
)

// wakeOpts are the options of a waiter in mode m, and of a holder that
// keeps it out.
func wakeOpts(m string) (waiter, holder []locker.LockOption) {
	switch m {
	case "permit":
		return []locker.LockOption{locker.Semaphore(1)}, []locker.LockOption{locker.Semaphore(1)}
	case "read":
		return []locker.LockOption{locker.Read()}, []locker.LockOption{locker.Write()}
	case "write":
		return []locker.LockOption{locker.Write()}, []locker.LockOption{locker.Read()}
	}
	return nil, nil
}

func init() { childModes["wake"] = wakeChild }

// wakeChild is a waiter in a process of its own (TestChild, mode "wake"):
// for each line on its stdin it acquires "w" in WAKE_MODE through a
// Client (polling, with WAKE_POLL=1), prints when it got it (Unix
// nanoseconds), and releases it.
func wakeChild(dir string) error {
	d, err := New(dir, WithSync(false))
	if err != nil {
		return err
	}
	var drv backend.Driver = d
	if os.Getenv("WAKE_POLL") == "1" {
		drv = struct {
			polling
			backend.Modal // semaphores and read-write locks still
		}{polling{d}, d}
	}
	c, err := locker.New(drv, locker.WithNamespace("wake"))
	if err != nil {
		return err
	}
	defer c.Close()
	opts, _ := wakeOpts(os.Getenv("WAKE_MODE"))
	ctx := context.Background()
	for in := bufio.NewScanner(os.Stdin); in.Scan(); {
		l, err := c.Acquire(ctx, "w", opts...)
		if err != nil {
			return err
		}
		got := time.Now()
		if err := l.Release(ctx); err != nil {
			return err
		}
		fmt.Println(got.UnixNano())
	}
	return nil
}

// BenchmarkWakeProcs: how long after a release a waiter in another
// process has the lock, in each mode (exclusive, permit, read behind a
// writer, write behind a reader), through the driver's own wait and,
// as poll-, through the locker package's polling. The waiter blocks
// 20ms before each release. Run with -benchtime 1x.
func BenchmarkWakeProcs(b *testing.B) {
	const rounds = 40
	dir := b.TempDir()
	d, err := New(dir, WithSync(false))
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("wake"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, poll := range []string{"0", "1"} {
		for _, m := range []string{"exclusive", "permit", "read", "write"} {
			cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"=wake", "FILELOCK_DIR="+dir, "WAKE_MODE="+m, "WAKE_POLL="+poll)
			cmd.Stderr = os.Stderr
			in, _ := cmd.StdinPipe()
			outp, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			out := bufio.NewScanner(outp)
			_, hold := wakeOpts(m)
			var lat []time.Duration
			for range rounds {
				l, err := c.TryAcquire(ctx, "w", hold...)
				if err != nil {
					b.Fatal(err)
				}
				fmt.Fprintln(in)
				time.Sleep(20 * time.Millisecond)
				rel := time.Now()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
				if !out.Scan() {
					b.Fatalf("%s (poll %s): the child ended", m, poll)
				}
				got, _ := strconv.ParseInt(out.Text(), 10, 64)
				lat = append(lat, time.Unix(0, got).Sub(rel))
			}
			in.Close()
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			name := m
			if poll == "1" {
				name = "poll-" + m
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(us(bench.Percentile(lat, 0.5)), name+"-p50-µs")
			b.ReportMetric(us(bench.Percentile(lat, 0.9)), name+"-p90-µs")
		}
	}
}

// A raised limit wakes a waiter of another driver as a release does: the
// kernel wakes its ticket (woken), not its own look every waitCap.
func TestResizeWakes(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	var ds [2]*Driver
	for i := range ds {
		d, err := New(dir, WithSync(false))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds[i] = d
	}
	permit := func(tok string) backend.Claim {
		return backend.Claim{Key: "k", Token: tok, TTL: time.Minute, Mode: backend.Permit, Limit: 1}
	}
	if _, err := ds[0].TryAcquire(ctx, permit("holder")); err != nil {
		t.Fatal(err)
	}
	_, tk, err := ds[1].Enqueue(ctx, permit("waiter"))
	if err != nil || tk == nil {
		t.Fatalf("Enqueue of a full semaphore = %v, %v; want a ticket", tk, err)
	}
	defer tk.Leave(ctx)
	if _, err := tk.Wait(ctx); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("the ticket's first look = %v, want ErrNotAcquired", err)
	}
	time.AfterFunc(20*time.Millisecond, func() { ds[0].Resize(ctx, "k", 2) })
	start := time.Now()
	// Looks that time out (waitCap) before the resize are no wake-ups.
	for i := 0; ; i++ {
		_, err := tk.Wait(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrNotAcquired) || i == 20 {
			t.Fatalf("the waiter, %v after the limit was raised: %v", time.Since(start), err)
		}
	}
	if n := ds[1].woken.Load(); n != 1 {
		t.Fatalf("the waiter was woken %d times (granted after %v), want once, by the resize", n, time.Since(start))
	}
	ds[0].Resize(ctx, "k", 0)
}
