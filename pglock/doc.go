// Package pglock keeps locks in a PostgreSQL table, through pgx.
//
//	import _ "github.com/lockerhq/locker/pglock"
//
//	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
//
//	postgres://user[:password]@host[:port][,host2[:port2]]/database[?params]   (or postgresql://)
//
// The password comes from the URL, PGPASSWORD or ~/.pgpass, as with libpq.
// With a pool of your own, make the driver with [New] (or [OpenConfig] from
// a pool configuration) and pass it to locker.New; [Open] makes its own.
// Statements run on the pool, one autocommitted statement each, never
// inside a transaction of yours. The table (locker_locks) is created on
// first use, or by your migrations ([SchemaSQL]) with create_table=false.
//
// Guarantees: one row per held name, taken by one INSERT ... ON CONFLICT
// DO UPDATE; fences from the table's identity sequence, so they only grow
// and a release leaves no row; expiry on the database server's clock,
// never the client's; a Client's waiters queue in arrival order and are
// woken by LISTEN/NOTIFY; semaphores and read-write locks in a second
// table. Limits: a lock is as available as the one primary (a failover to
// an asynchronous standby can lose a recent acquisition, and two holders
// can overlap, which the fence reveals); whoever can read the table reads
// the tokens; no order between processes. See Limits.
//
// How it works, in full (the table, fences, migration, waiting,
// notifications, semaphores and read-write locks) is in the repository's
// docs/backends/pglock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/pglock.md
//
// # URLs
//
//	postgres://user[:password]@host[:port][,host2[:port2]]/database?param=value&...
//	postgresql://...
//
// The form is pgx's (and libpq's): every pgx parameter works (sslmode,
// sslrootcert, connect_timeout, target_session_attrs, pool_max_conns,
// default_query_exec_mode, ...). Use sslmode=verify-full with sslrootcert
// on any network you do not fully control: the lighter modes (prefer,
// require) do not check who the server is. The password need not be in the
// URL: pgx reads PGPASSWORD and ~/.pgpass (passfile) as libpq does.
//
// Parameters of our own:
//
//	lock_table=NAME     the table (default locker_locks)
//	lock_schema=NAME    its schema (default: the search_path decides)
//	create_table=false  do not create the table (or schema); only check it exists
//
// pgx would pass any other parameter to the server as a session setting, so
// only a few harmless ones are accepted (application_name, search_path,
// timezone, options, statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout); anything else is an error wrapping
// locker.ErrInvalidURL, so that a misspelt option is caught at once.
//
// # Security
//
// TLS comes from pgx's own URL parameters: sslmode=verify-full with
// sslrootcert=CA-FILE checks the server's certificate and name; sslcert and
// sslkey (and sslpassword for an encrypted key) send a client certificate.
// A wrong password, no password, a user the server does not know, a
// connection that pg_hba refuses (plain TCP to a hostssl-only server) and
// insufficient_privilege are errors wrapping backend.ErrPermission, at Open
// or at the first statement that needs the privilege, never retried. No
// message carries a password from the URL (userinfo, password=,
// sslpassword=).
//
// The least privilege, once the table exists (made by its owner, or by
// schema.sql), for the role in the URL:
//
//	GRANT CONNECT ON DATABASE app TO locker_app;              -- PUBLIC has it by default
//	GRANT USAGE ON SCHEMA locks TO locker_app;                -- public: PUBLIC has it by default
//	GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locker_locks TO locker_app;
//	GRANT SELECT, INSERT, UPDATE, DELETE ON locks.locker_locks_shared TO locker_app; -- semaphores, read-write locks
//
// SELECT is read at Open (the table check and the notification key) and by
// every statement's WHERE; INSERT acquires a free name (and makes the
// notification key once); UPDATE takes an expired row and refreshes;
// DELETE releases. No grant on the fence sequence: the default of an
// identity column draws from it without one (nextval by name would need
// USAGE). The advisory locks need no privilege. No CREATE, and no ownership:
// with the table there, create_table may stay on (it only looks). Without
// one of those grants, Open or the first acquire fails with ErrPermission.
// LISTEN needs no privilege. WithCreateTable(true) on a missing table needs
// CREATE on the schema (and on the database, for a lock_schema that does
// not exist yet); the creator owns the table.
//
// A role with SELECT on the table reads every holder's token and the
// notification key; with UPDATE (or DELETE) it can free, take or extend any
// lock by writing the row. Such a theft is seen by the holder at its next
// refresh, which checks token, owner, version and expiry: a Client's lost
// signal fires at most TTL/3 after the theft (the watchdog refreshes every
// TTL/3, up to TTL/12 early), plus that refresh's round trip. A role
// without grants on the table can do nothing to a lock; with only SELECT, it
// can watch.
//
// # Limits
//
// It needs PostgreSQL 12 or later (identity columns, MATERIALIZED).
// Lock names are stored as text: the database should use the UTF8 encoding
// (with another encoding, names with characters it cannot represent fail).
// Anyone who can read the table can read tokens, and anyone who can write
// it can take locks (see Security). The lock is only as available as the database: with a failover to an
// asynchronous replica, a lock acquired just before the failover can be
// lost, and two holders can then overlap, which the fence reveals.
package pglock
