// Package sqllock keeps locks in a PostgreSQL table, through pgx.
//
// Import it for its side effect and open a Client by URL:
//
//	import _ "github.com/lockerhq/locker/sqllock"
//
//	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
//
// or build the driver from a pool you already have with [New] (or from a
// pool configuration with [OpenConfig]) and pass it to locker.New.
// Statements run on the pool, one autocommitted statement each, never
// inside a transaction of yours. [Driver.Inspect] shows a lock as the
// database sees it; so does a plain SELECT on the table.
//
// # The table
//
// One row per lock name (namespace + "/" + name) in a table, locker_locks
// by default: the holder's token, its owner identity, a version and an
// expiry time (see [SchemaSQL], also shipped as schema.sql). Acquiring is one
// INSERT ... ON CONFLICT DO UPDATE that takes the row only when it is free
// or expired, and adds one to its version, which is the fencing token.
// Refresh and release are UPDATEs conditional on the token (and version);
// the watchdog's batches of refreshes are one UPDATE over arrays. A release
// keeps the row with a NULL token, so versions never restart. All
// expiry arithmetic uses the database server's clock (clock_timestamp()),
// never the client's: client clock skew cannot make a lock expire early or
// late. TTLs count whole microseconds and are rounded up to one.
//
// The table is created on first use (CREATE TABLE IF NOT EXISTS, serialized
// between processes by an advisory lock). Teams that run their own
// migrations run schema.sql there and open the driver with
// create_table=false, or [CreateTable](false).
//
// # Waiting
//
// A release runs pg_notify(channel, key) in the same statement. While a
// Client waits for a lock, one extra connection per driver LISTENs on the
// channel for every waiter of that driver, and wakes the waiters of the
// released key at once; the Client's capped backoff covers a notification
// that was missed (the listener reconnects when its connection drops, and
// then wakes every waiter). The listening connection closes 30 seconds after
// the last waiter left ([ListenIdle]). LISTEN does not work through a
// transaction-pooling proxy such as PgBouncer in transaction mode: waiting
// then falls back to polling.
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
// # Limits
//
// Lock names are stored as text: the database should use the UTF8 encoding
// (with another encoding, names with characters it cannot represent fail).
// Anyone who can read the table can read tokens, and anyone who can write
// it can take locks: give the table the privileges your locks deserve. The
// lock is only as available as the database: with a failover to an
// asynchronous replica, a lock acquired just before the failover can be
// lost, and two holders can then overlap, which the fence reveals.
package sqllock
