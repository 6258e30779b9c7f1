-- The table of github.com/lockerhq/locker/pglock (PostgreSQL).
--
-- pglock runs this statement itself on first use. Teams that manage their
-- schema with migrations run it there instead and open the driver with
-- create_table=false (pglock.WithCreateTable(false)). For another table name or
-- schema, replace locker_locks below (e.g. by ops.locker_locks) and give the
-- driver the same name: lock_table= and lock_schema= in the URL, or
-- pglock.WithTable and pglock.WithSchema.
--
-- One row per lock name. A released lock keeps its row (token NULL), so that
-- version, the fencing token, never restarts. Rows are small; delete rows
-- whose token is NULL only if you do not need fences that increase forever.
-- The row named 'sqllock:notify-key' (added by the driver on first use) holds
-- the secret that keys the release notifications: keep it. (It keeps the
-- package's former name, sqllock, as do the notification channel and the
-- creation lock, so that tables and processes of either name work together.)
--
-- Least privilege for the application's role, once the table exists:
--   GRANT SELECT, INSERT, UPDATE ON locker_locks TO app;  (and USAGE on its schema)
CREATE TABLE IF NOT EXISTS locker_locks (
    name        text        PRIMARY KEY, -- namespace/name of the lock
    token       text,                    -- the holder's secret; NULL when released
    owner       text,                    -- the holder's owner identity (informational)
    version     bigint      NOT NULL,    -- fencing token: +1 at every acquisition
    acquired_at timestamptz NOT NULL,    -- server clock
    expires_at  timestamptz NOT NULL     -- server clock; the lock is free once it has passed (or token is NULL)
);
