//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filelock

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

func supported() error { return nil }

// flockCtx takes an exclusive flock on f. Holders keep it for microseconds,
// so it polls without blocking a thread in the kernel, and gives up when ctx
// ends (a process stopped in the middle of an operation keeps its flock).
// It yields the CPU between tries for spinFor first: a sleep under a
// millisecond costs a millisecond when the runtime has nothing else to
// do (its poller waits in whole milliseconds), many times an operation.
func flockCtx(ctx context.Context, f *os.File) error {
	const spinFor = 200 * time.Microsecond
	fd := int(f.Fd())
	var start time.Time
	wait := 50 * time.Microsecond
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if start.IsZero() {
			start = time.Now()
		}
		if time.Since(start) < spinFor {
			yield()
			continue
		}
		time.Sleep(wait)
		wait = min(wait*2, 5*time.Millisecond)
	}
}

// probeWaiter returns the file at path, opened with flag, if a live waiter
// keeps it flocked; closing it, if opened for writing, wakes that waiter
// (IN_CLOSE_WRITE). An unlocked file is a dead waiter's, removed here (the
// caller holds the key's flock, under which waiter files are made and
// removed). Any error counts as no waiter.
func probeWaiter(path string, flag int) *os.File {
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return f
	}
	if err == nil {
		os.Remove(path)
	}
	f.Close()
	return nil
}
