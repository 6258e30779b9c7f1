// Package filelock is a host-local lock store: scheme file://. Locks live as
// small state files in one directory, shared by every process of the machine
// that can write there. It needs no server, and it is the backend lockctl
// uses when none is configured.
//
//	import _ "github.com/lockerhq/locker/filelock"
//
//	c, err := locker.Open(ctx, "file:///var/lib/myapp/locks")
//
// Or make the driver with [New] (a directory; [DefaultDir] is lockctl's)
// and pass it to locker.New.
//
// Guarantees: every operation runs under a short flock(2) of the key's
// file and no process holds a flock while it holds a lock, so a crashed or
// stopped holder blocks no one past its TTL; fences from one counter per
// directory, which survive a power cut and never repeat (unless
// sync=false); on Linux, waiters queue in arrival order across processes
// and the kernel (inotify) wakes one per release, and expiry follows
// CLOCK_BOOTTIME, so stepping the wall clock neither frees nor keeps
// locks; semaphores and read-write locks.
// Limits: one machine and a local file system (never NFS); processes that
// share locks run as the same user; off Linux, waiters poll and expiry
// follows the wall clock. See Limits.
//
// How it works, in full (state files, waiting on Linux, operators, fences,
// the clock, durability) is in the repository's docs/backends/filelock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/filelock.md
//
// # URLs
//
//	file:///absolute/dir[?sync=false]
//	file:relative/dir[?sync=false]     (relative to the working directory at Open)
//
// The directory is created (mode 0700) when missing. A host other than
// "localhost" (file://host/dir) is an error: the store is local by design.
// Parameters: sync=false skips the fsync after each acquisition (see
// Durability in docs/backends/filelock.md); namespace= and ttl= belong to
// the locker package.
//
// # Limits
//
// It works on Linux and the BSDs, macOS included (flock(2)); elsewhere Open
// fails with backend.ErrUnsupported. It does not reach across machines, and
// flock over NFS is not to be trusted: use a local file system (inotify
// does not see other machines either). Off Linux waiters poll with the
// locker package's backoff (up to 250 ms between tries, waiters in the
// same process are woken at once): no queue, so no fairness.
// Files are created with mode 0600 and a missing directory with mode 0700:
// the processes that share locks must run as the same user. A process stopped (SIGSTOP,
// a debugger) in the few microseconds of an operation keeps that file's
// flock, and operations on the same name by others wait until it continues
// or their context ends.
package filelock
