// Package pglock keeps locks in a PostgreSQL table, through pgx.
//
// Import it for its side effect and open a Client by URL:
//
//	import _ "github.com/lockerhq/locker/pglock"
//
//	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
//
// or build the driver from a pool you already have with [New] (or from a
// pool configuration with [OpenConfig]) and pass it to locker.New.
// Statements run on the pool, one autocommitted statement each, never
// inside a transaction of yours. [Driver.Inspect] shows a lock as the
// database sees it (owner, fence, time left by the server's clock; no
// queue: waiters leave no trace in the table), so does a plain SELECT on the
// table; [Driver.List] is one SELECT of the held rows under a prefix, and
// [Driver.Break] one DELETE of a holder's row under its fence, notified
// and fenced as a release.
//
// # The table
//
// One row per held lock name (namespace + "/" + name) in a table,
// locker_locks by default: the holder's token, its owner identity, a
// version and an expiry time (see [SchemaSQL], also shipped as schema.sql).
// Acquiring is one INSERT ... ON CONFLICT DO UPDATE that takes the row only
// when it is free or expired, and gives it a new version, the fencing
// token. Refresh is an UPDATE conditional on the token (and version); the
// watchdog's batches of refreshes are one UPDATE over arrays. A release is
// one DELETE of the token's row (with its notification): a released name
// leaves nothing in the database. The row of a lock that expired without a
// release stays until the name is taken again.
//
// Fences come from one counter for the whole table, the identity sequence
// of the version column (a PostgreSQL sequence only grows), not from the
// name's row, which comes and goes: so they keep increasing for a name
// across releases. The update branch draws the next value after locking
// the row, hence above its last holder's. The insert branch draws it before
// looking for a row; a pair of transaction-scoped advisory locks per name,
// (a class derived from the table's name, hashtext(key)), taken shared by
// acquisitions and exclusive by releases, keeps a release from deleting the
// name's row between the draw and the look, so that a deleted row always
// had a lower fence (an application that takes two-key advisory locks of
// its own may meet one, and then delays that name's acquisitions while it
// holds it). The counter is 64-bit and starts at 1. Sequence values
// are never reused, whatever rolls back: fences have gaps, never repeats.
// Both costs are inside the statements: a TryAcquire and a Release are one
// round trip each, as before.
//
// A table made by an older version (version without IDENTITY, released rows
// kept) is migrated on first use when create_table is on: [MigrationSQL]
// makes the column draw from a sequence that starts above every fence
// given so far, and deletes the released rows. That needs the table's
// owner; other roles get an error wrapping ErrPermission that names
// MigrationSQL, and with create_table=false it is an error until someone
// runs it. Stop every process of the older version first: it still gives
// fences from the row, and restarts them at 1 for a name whose row a newer
// process deleted.
//
// All expiry arithmetic uses the database server's clock (clock_timestamp()),
// never the client's: client clock skew cannot make a lock expire early or
// late. TTLs count whole microseconds and are rounded up to one.
//
// The table is created on first use (CREATE TABLE IF NOT EXISTS, serialized
// between processes by an advisory lock). Teams that run their own
// migrations run schema.sql there and open the driver with
// create_table=false, or [WithCreateTable](false).
//
// # Waiting
//
// The driver is a backend.Notifier: the locker package waits, and only
// the first of a Client's waiters on an object tries the table, at each
// release notification. A release is contested by one waiter per Client,
// and a releaser that comes back waits behind the others. Clients are not
// ordered among themselves.
//
// One extra connection per driver LISTENs on the channel for every waiter
// of that driver, and wakes the waiters of the released key at once; a
// backoff timer covers a notification that was missed (the listener
// reconnects when its connection drops, and then wakes every waiter). The
// listening connection closes 30 seconds after the last waiter left
// ([WithListenIdle]). LISTEN does not work through a
// transaction-pooling proxy such as PgBouncer in transaction mode: waiting
// then falls back to polling.
//
// A release notifies only when someone waits for its key, since the
// notification is about a third of its cost: a waiter's driver holds a
// shared session advisory lock of the key (on one more connection of its
// own, until a second after the key's last waiter left), and the release's
// statement notifies unless it can take that lock exclusively (it then
// holds it until it commits, so that a waiter arriving meanwhile finds the
// key free at its first try). Releases by older versions of the package
// always notify; their waiters, which hold no such lock, learn of releases
// by newer ones at their backoff timer only: upgrade every process.
//
// The notification is sent in the release's statement. Its payload is not the key
// but a keyed hash of it, hex(SHA-256(k || SHA-256(k || key))), where k is a
// random secret kept in the table itself, in the row named
// "sqllock:notify-key" (its token; the row looks like a lock held forever,
// and no lock key can have that name, which has no '/'). The first driver
// that finds no such row makes it (an INSERT), so tables made by older
// versions get one at once. Any role that may connect may LISTEN on the
// channel; without SELECT on the table it cannot read k, and learns no lock
// name, nor a hash it could test a guessed name against: only that a lock
// was released, and whether it is one it saw released before. (Any role may
// also NOTIFY on the channel: a forged payload only wakes waiters for an
// extra try.) Do not delete that row: drivers that read the old key miss the
// wake-ups of the new one until they reopen, and fall back to polling.
//
// # Semaphores and read-write locks
//
// They live in a second table, the lock table's name followed by _shared
// ([SharedSchemaSQL], shared.sql; made on their first use, or by your
// migrations with create_table=false), one row per permit, reader, writer
// and waiting writer, apart from the name's lock. A grant is one round
// trip: a pipeline, run by PostgreSQL as one implicit transaction, that
// takes the object's advisory lock, then counts its live holders by the
// server's clock and upserts the token's row; under READ COMMITTED each
// statement's snapshot is taken as it starts, after the lock. The lock's
// statement also turns bitmap and sequential scans off for that
// transaction alone, so that the count reads the object's rows by a plain
// index scan, which marks released rows' index entries dead for the next
// grant instead of reading them all until a vacuum. A session
// whose default isolation is another makes the grant statement change
// nothing, and the driver's grants then run in explicit READ COMMITTED
// transactions. The fence, from that table's identity sequence, is drawn
// under the lock, so it increases per object in grant order.
// Refreshes take the object's lock shared, so that no grant counts as
// expired a holder whose refresh is in flight; a release deletes the row
// and notifies as a lock's release does. Writers are preferred: a waiting
// writer records itself as the waiting one (until its TTL, renewed by its
// next try; a TryAcquire records nothing), and readers are refused while
// that record lives.
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
//
// # Name
//
// This package was sqllock. It works with PostgreSQL only, through pgx (its
// schemes are postgres and postgresql, and it holds one set of statements,
// PostgreSQL's), so it is named after its store, as the other backends are.
// Names it keeps in the database (the notification channel, the
// notification key's row, the creation and fence locks) still say sqllock, so that
// tables made before the rename keep working.
package pglock
