// Package sqlite keeps locks in an SQLite database file, shared by the
// processes of one host, through the pure-Go driver modernc.org/sqlite.
//
//	import _ "github.com/lockerhq/locker/sqllock/sqlite"
//
//	c, err := locker.Open(ctx, "sqlite:///var/lib/app/locks.db")
//
//	sqlite:///absolute/path/locks.db[?params]
//
// The file and its table are created on first use. The path must be
// absolute: a relative one would name another file in every process with
// another working directory. Parameters:
//
//	busy_timeout=5s     how long a statement waits for another connection's write (default 5s)
//	lock_table=NAME     the table (default locker_locks)
//	create_table=false  do not create the table; only check it exists
//
// Anything else is an error wrapping locker.ErrInvalidURL, before the file
// is touched. Every connection runs PRAGMA busy_timeout and
// journal_mode=WAL. [Open] gives a driver that owns its database: Close
// closes it. With a *sql.DB of your own, from this or another SQLite
// driver (mattn/go-sqlite3, ncruces/go-sqlite3), use sqldb.New(db,
// sqldb.SQLite) instead; this package is only the URL.
//
// Guarantees: those of sqldb, with semaphores and read-write locks: one
// row per held name, inserted when the name is free (its expired row
// deleted first), deleted by the release;
// fences from the table's AUTOINCREMENT rowid, never reused, so they grow
// across releases, takeovers and restarts; expiry on the host's clock in
// the SQL, the same for every process on the host. SQLite runs one write
// at a time, so each statement is atomic. A write kept waiting by another
// past busy_timeout fails as "could not tell" (SQLITE_BUSY), which the
// Client retries; a file or directory this process may not write is an
// error wrapping locker.ErrPermission.
//
// Limits: one host: the file must be on a local file system (WAL needs
// shared memory; NFS and the like are not safe). SQLite's clock ticks in
// milliseconds, so a lock lives its TTL plus up to 1 ms. Waiters in other
// processes poll with the Client's backoff. Writes are serialized for the
// whole file (about 2,000 lock cycles a second on a 2-core host,
// each commit synced); whoever can read the file reads the tokens.
//
// How it works, the measurements behind the choice of driver: the
// repository's docs/backends/sqllock.md, section SQLite.
package sqlite
