// Package sqllock keeps locks in a PostgreSQL table, through pgx.
//
//	import _ "github.com/lockerhq/locker/sqllock"
//
//	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
//
//	postgres://user[:password]@host[:port][,host2[:port2]]/database[?params]   (or postgresql://)
//
// Every pgx (libpq) parameter works (sslmode, sslrootcert, sslcert,
// connect_timeout, target_session_attrs, pool_max_conns, ...): use
// sslmode=verify-full with sslrootcert on any network you do not fully
// control. The password comes from the URL, PGPASSWORD or ~/.pgpass, as
// with libpq. Parameters of our own:
//
//	lock_table=NAME     the table (default locker_locks)
//	lock_schema=NAME    its schema (default: the search_path decides)
//	create_table=false  do not create the table (or schema); only check it exists
//
// Of the server settings that pgx would pass on, only application_name,
// search_path, timezone, options, statement_timeout, lock_timeout and
// idle_in_transaction_session_timeout are accepted; any other parameter is
// an error wrapping locker.ErrInvalidURL, so that a misspelt option is
// caught at once.
//
// With a pool of your own, make the driver with [New] (or [OpenConfig] from
// a pool configuration) and pass it to locker.New; [Open] makes its own.
// Statements run on the pool, one autocommitted statement each, never
// inside a transaction of yours. The tables (locker_locks, and
// locker_locks_shared for semaphores and read-write locks) are created on
// first use, or by your migrations ([SchemaSQL], [SharedSchemaSQL]) with
// create_table=false.
//
// Guarantees: one row per held name, taken by one INSERT ... ON CONFLICT
// DO UPDATE; fences from the table's identity sequence, so they only grow
// and a release leaves no row; expiry on the database server's clock,
// never the client's; a Client's waiters queue in arrival order and are
// woken by LISTEN/NOTIFY; semaphores and read-write locks in a second
// table. Refused credentials and insufficient_privilege are errors
// wrapping backend.ErrPermission, never retried, and no message carries
// a password.
//
// Limits: PostgreSQL 12 or later, a UTF8 database; a lock is as available
// as the one primary (a failover to an asynchronous standby can lose a
// recent acquisition, and two holders can overlap, which the fence
// reveals); whoever can read the table reads the tokens, and whoever can
// write it can take locks; no order between processes.
//
// How it works, the least privileges, TLS and the limits in full are in
// the repository's docs/backends/sqllock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/sqllock.md
package sqllock
