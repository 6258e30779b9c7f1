// Package filelock is a host-local lock store: scheme file://. Locks live as
// small state files in one directory, shared by every process of the machine
// that can write there. It needs no server, and it is the backend lockctl
// uses when none is configured.
//
//	import _ "github.com/lockerhq/locker/filelock"
//
//	c, err := locker.Open(ctx, "file:///var/lib/myapp/locks")
//
// # URLs
//
//	file:///absolute/dir[?sync=false]
//	file:relative/dir[?sync=false]     (relative to the working directory at Open)
//
// The directory is created (mode 0700) when missing. A host other than
// "localhost" (file://host/dir) is an error: the store is local by design.
// Parameters: sync=false skips the fsync after each acquisition (see
// Durability); namespace= and ttl= belong to the locker package.
//
// # How it works
//
// A held key has a state file: the key escaped with backend.EscapeKey, or,
// past 200 bytes, shortened with backend.ShortKey (a prefix and a SHA-256),
// plus ".lock". Every operation opens the file, takes an exclusive flock(2)
// on it for the few microseconds it needs, checks that the file it opened
// is still the one at the path (same inode; a release may have removed it
// meanwhile, and then it opens the path again), reads the state, decides,
// writes the new state in place, or removes the file, and unlocks. No process holds the flock while it
// holds the lock: the flock only serializes operations, so a holder that
// crashes or is stopped never blocks anyone for longer than its TTL, after
// which the lock counts as free.
//
// The state file holds two fixed-size records, each with a CRC; a write goes
// to the older one, and a reader takes the valid record with the higher
// sequence number. A write torn by a power cut therefore leaves the previous
// state readable. Writes are in place rather than by rename, because a rename
// would replace the inode that other processes are waiting to flock. After
// the records the file keeps its key, written with the first record (a
// shortened name cannot be turned back into its key); files of older
// versions get it at their next write.
//
// # Waiting (Linux)
//
// On Linux the driver is a backend.Waiter: a blocked Acquire queues in the
// lock file and the kernel wakes it, in arrival order, whichever process
// it is in. A waiter takes a ticket under the file's flock and keeps a
// file of its own, the escaped key plus "%.w" and the ticket, flocked
// while it waits, with an inotify watch on it. While tickets are queued, a
// free lock goes to the first live one only: the release keeps the lock
// for it for 100 ms and wakes it by opening its file for writing
// (IN_CLOSE_WRITE), one waiter per release; a releaser that comes straight
// back queues behind the others, and TryAcquire is refused meanwhile. A
// waiter killed with -9 loses its file's flock, and the next operation
// that reaches its ticket removes its file and passes over it; one that
// does not take a lock kept for it within 100 ms (stopped, or very slow)
// is passed over and queues again at the back when it comes back. Waiters
// also look every 250 ms, and when the holder's TTL ends, so a holder
// killed with -9 frees the lock at its TTL as before. The queue only
// decides who may take a free lock: who holds it, and until when, is the
// record's, as without it. A driver keeps the inotify instances of its
// finished waiters for its next ones (closing one takes the kernel
// milliseconds) and closes them at Close. Semaphores and read-write locks
// have no queue: their waiters try again whenever the object's file is
// written or removed (inotify), and at least every 250 ms. Elsewhere
// waiters poll, through the locker package.
//
// # Operators
//
// The driver implements backend.Inspector, Lister and Breaker. Inspect
// reports a holder's owner (its first 64 bytes), fence and time left, not
// the waiters. List reads every lock file of the directory, each under its
// flock. Break frees the lock, under its flock, as a release does: the
// removed holder's next Refresh finds it gone, and the next holder's fence
// comes from the directory's counter, above it.
//
// Fencing tokens come from one counter per directory, the file
// fence.counter (in the same two-record format, with fence.ceiling, see
// Durability), raised under its own flock, taken after the key's, by every
// acquisition that takes a free or expired lock. So a release removes the key's file, under its flock, and
// a released name leaves nothing in the directory; its next fence is still
// above all earlier ones. An expired lock's file stays until the name is
// taken again. Files of older versions, which kept a counter per file, go
// on above their own counter, and are removed at their next release. Do not
// run older versions on the same directory: they restart a removed name's
// fences at 1. Deleting fence.ceiling (or, off Linux, fence.counter)
// restarts every name's fences.
//
// # Semaphores and read-write locks
//
// The driver is a backend.Modal: a key's semaphore and read-write lock are
// each a file beside its lock file, the escaped key plus "%.sem" or "%.rw"
// (names no key's lock file can have), read and rewritten under its
// flock as a lock file is: the limit, every holder (token hash, owner,
// fence, expiry on the lock's clock) and the waiting writer. Fences come
// from the directory's counter, as a lock's. Waiters try again at each
// change of the file (see Waiting); writers are
// preferred (a refused writer's record turns new readers away until it is
// granted, withdraws or expires). A holder killed with -9 frees its permit
// TTL after its last refresh, and an object left empty removes its file.
// A file holds at most backend.MaxLimit holders: readers past that wait.
// A write puts the new state beside the old one and then points the file's
// small header at it, so an operation killed mid-write or a full disk
// leaves the previous state; after a power cut the file counts as empty
// (its holders died with the boot).
//
// # Clock
//
// One machine, one clock. On Linux, expiry is measured on CLOCK_BOOTTIME,
// together with the kernel's boot ID: a step of the wall clock (NTP, an
// administrator) neither frees locks early nor keeps them late, time spent
// suspended counts, and a lock written before a reboot counts as free after
// it (its holder died with the boot). Elsewhere expiry is wall-clock time in
// Unix nanoseconds, so a wall clock stepped forward frees locks early and one
// stepped back keeps them late by the step.
//
// # Durability
//
// Fences survive a power cut and never repeat. On Linux the counter is not
// fsynced at each acquisition: fence.ceiling, a bound above every fence
// given, is raised 4096 past the next fence and fsynced whenever a fence
// would pass it, and a counter written in an earlier boot (so possibly
// missing its last writes) goes on from above the ceiling: one fsync per
// 4096 new fences, and fences skip up to 4096 after a reboot. Elsewhere
// (no boot ID tells a lost write from an old one) the counter is fsynced
// at every new fence. The directory is fsynced once, when the counter files
// are made. The key's own file needs no fsync:
// after a power cut every holder is gone (on Linux, locks of an earlier
// boot count as free), and a lock whose release was lost expires with its
// TTL. sync=false skips the fsyncs, for tmpfs or when repeated fences
// after a power cut do not matter.
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
