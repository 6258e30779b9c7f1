//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package filelock

import (
	"context"
	"fmt"
	"os"

	"github.com/lockerhq/locker/backend"
)

func supported() error {
	return fmt.Errorf("filelock: %w: needs flock(2) (Linux, macOS, the BSDs)", backend.ErrUnsupported)
}

func flockCtx(context.Context, *os.File) error { return supported() }

func probeWaiter(string, int) *os.File { return nil }
