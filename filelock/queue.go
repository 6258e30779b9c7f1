package filelock

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Waiters queue in the lock file (on Linux; wait_linux.go, and Waiting in
// docs/backends/filelock.md): a waiter takes ticket qtail and keeps its own
// file, the escaped key plus "%.w" and the ticket, flocked while it waits,
// so that a waiter killed with -9 is seen and passed over. A free lock goes
// to the first live ticket only, kept for it for resvGrace. The queue only
// decides who may take a free lock: exclusion and TTLs are the record's.
const (
	waitSuffix = "%.w"
	// resvGrace is how long a free lock is kept for a woken waiter.
	resvGrace = 100 * time.Millisecond
)

// waiterPath returns the file of key's waiter with ticket t.
func (d *Driver) waiterPath(key string, t uint64) string {
	return filepath.Join(d.dir, backend.ShortKey(key, maxBase)+waitSuffix+strconv.FormatUint(t, 10))
}

// queued reports whether ticket t is in r's queue.
func queued(r *record, t uint64) bool { return t >= r.qhead && t < r.qtail }

// next decides, for a lock that is free or expired, which queued ticket
// may take it: the one it is kept for, or the first live one, which it
// then keeps for it and returns open in wake: closing wake (nil-safe)
// after the key's flock is dropped wakes it without it finding the flock
// taken. ok is false when no live waiter is queued. It passes over, and
// removes the files of, dead waiters. The caller holds the key's flock
// and writes r back.
func (d *Driver) next(key string, r *record, now int64) (t uint64, ok bool, wake *os.File) {
	if r.resvExp != 0 && r.qhead < r.qtail {
		// Probed even when late, so that a dead waiter's file goes; read
		// only, so that closing it wakes nobody.
		if f := probeWaiter(d.waiterPath(key, r.qhead), os.O_RDONLY); f != nil {
			f.Close()
			if now < r.resvExp {
				return r.qhead, true, nil
			}
		}
		// Not taken in time, or its waiter is gone: the next one's turn.
		r.qhead++
	}
	r.resvExp = 0
	for ; r.qhead < r.qtail; r.qhead++ {
		if f := probeWaiter(d.waiterPath(key, r.qhead), os.O_WRONLY); f != nil {
			r.resvExp = now + int64(resvGrace)
			return r.qhead, true, f
		}
	}
	r.qhead, r.qtail = 0, 0 // empty: tickets start again
	return 0, false, nil
}

// free marks r released, passing the lock to the next live waiter if any,
// and says whether the file stays (write) or goes (remove).
func (d *Driver) free(key string, r *record, now int64) (change, *os.File) {
	r.expires, r.token, r.pid, r.owner = 0, [32]byte{}, 0, ""
	if _, ok, wake := d.next(key, r, now); ok {
		return write, wake
	}
	return remove, nil
}
