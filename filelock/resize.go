package filelock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/lockerhq/locker/backend"
)

var _ backend.Resizer = (*Driver)(nil)

// A limit set by Resize is a file of its own, the escaped key plus
// "%.lim" (no other file's name, as with semSuffix), in a lock file's
// two-record format with the limit where a lock file has its fence. Not
// in the semaphore's file: that goes with its last holder and counts as
// empty after a reboot, and the limit has no expiry. Resize writes and
// removes it, and every grant reads it, under the semaphore file's flock.
const limSuffix = "%.lim"

func (d *Driver) limitPath(key string) string {
	return filepath.Join(d.dir, backend.ShortKey(key, maxBase)+limSuffix)
}

// readLimit returns the limit Resize set on key's semaphore, 0 when none.
// Without one it costs one failed open.
func (d *Driver) readLimit(key string) (int, error) {
	path := d.limitPath(key)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("filelock: %w", err)
	}
	defer f.Close()
	r, _, empty, err := readFile(f, path)
	switch {
	case err != nil:
		return 0, err
	case empty:
		return 0, nil // a Resize killed before its first write
	case r.fence < 1 || r.fence > backend.MaxLimit:
		return 0, fmt.Errorf("filelock: %s holds no valid limit; Resize the semaphore again", path)
	}
	return int(r.fence), nil
}

// Resize implements backend.Resizer, under the semaphore file's flock: a
// semaphore with holders is written, which wakes its waiters as a release
// does (inotify), and its holders are then under the new limit.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	return d.updateObject(ctx, backend.Claim{Key: key, Mode: backend.Permit}, true, func(o *object, _ int64) (bool, error) {
		if err := d.writeLimit(key, limit); err != nil {
			return false, err
		}
		if limit == 0 || len(o.holders) == 0 {
			return false, nil
		}
		o.limit = limit
		return true, nil
	})
}

// writeLimit writes limit into key's limit file, or removes it for 0, and
// makes that survive a power cut unless sync=false.
func (d *Driver) writeLimit(key string, limit int) error {
	path := d.limitPath(key)
	if limit == 0 {
		switch err := os.Remove(path); {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("filelock: %w", err)
		case d.sync:
			return syncDir(d.dir)
		}
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	defer f.Close()
	r, _, empty, err := readFile(f, path) // damaged (err): written afresh
	if err == nil && !empty && r.fence == uint64(limit) {
		return nil
	}
	r.fence = uint64(limit)
	if err := writeRecord(f, path, &r, d.sync); err != nil {
		return err
	}
	if empty && d.sync {
		return syncDir(d.dir) // the file's name
	}
	return nil
}
