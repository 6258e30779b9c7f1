//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filelock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the driver's API.
func init() { measure.RegisterRawFloor((*Driver).rawFloor) }

// rawFloor is the bare file operations any acquire+release on this store
// costs at least. Acquire: open (creating)
// key's file, flock it, write one record, close; release: open, flock,
// unlink, close. No state is read, no fence drawn, no inode checked.
// The file is key's, under a "%.floor" suffix no lock's file has, and it
// is gone when rawFloor returns.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path := filepath.Join(d.dir, backend.ShortKey(key, maxBase)+"%.floor")
	var rec [recSize]byte
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	if err == nil {
		_, err = f.WriteAt(rec[:], 0)
	}
	f.Close()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("filelock: %w", err)
	}
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		os.Remove(path)
		return fmt.Errorf("filelock: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	return nil
}
