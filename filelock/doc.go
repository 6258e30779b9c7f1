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
// Limits: Linux, macOS and the BSDs (flock(2)); one machine and a local
// file system (never NFS); processes that share locks run as the same
// user; off Linux, waiters poll and expiry follows the wall clock.
//
// URLs: file:///absolute/dir or file:relative/dir (relative to the working
// directory at Open), with sync=false to skip the fsyncs; the directory is
// created (mode 0700) when missing, and a host other than "localhost" is an
// error. URLs, how it works (state files, waiting on Linux, operators,
// fences, the clock, durability) and the limits in full are in the
// repository's docs/backends/filelock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/filelock.md
package filelock
