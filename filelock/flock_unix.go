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
func flockCtx(ctx context.Context, f *os.File) error {
	wait := 20 * time.Microsecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(wait)
		wait = min(wait*2, 5*time.Millisecond)
	}
}
