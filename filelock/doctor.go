package filelock

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/lockerhq/locker/backend"
)

var _ backend.Diagnoser = (*Driver)(nil)

// Diagnose implements backend.Diagnoser: the directory's file system
// (flock between hosts of a network file system is not to be trusted),
// who may write the directory, and whether state files are synced.
func (d *Driver) Diagnose(ctx context.Context, _ time.Duration) ([]backend.Finding, error) {
	_, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("filelock: diagnose: %w", err)
	}
	defer done()
	fs := backend.Findings{Check: "file.", What: d.dir + ": "}
	switch name, network := fsType(d.dir); {
	case network:
		fs.Add("filesystem", backend.Unsafe, "on "+name, "flock and the state files' renames are not reliable between hosts of a network file system, and the locks exclude only this host's processes anyway",
			"a directory on a local file system; for several hosts, a server backend")
	case name != "":
		fs.Add("filesystem", backend.Sound, "on "+name+", local", "", "")
	}
	st, err := os.Stat(d.dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: diagnose: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o002 != 0 {
		fs.Add("permissions", backend.Warning, fmt.Sprintf("mode %v: every user may write it", perm),
			"any user of the host can delete a holder's state file and so let a second holder in",
			"chmod o-w on the directory (New makes it 0700)")
	} else {
		fs.Add("permissions", backend.Sound, fmt.Sprintf("mode %v", perm), "", "")
	}
	if !d.sync {
		fs.Add("sync", backend.Warning, "state files are not synced (sync=false)",
			"a power loss can take the fence counter back, so fences after it can repeat earlier ones",
			"sync=true (the default), unless the fences matter to nothing")
	}
	return fs.List, nil
}
