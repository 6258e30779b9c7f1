// Package sqldb keeps locks in a table of any database/sql database, in
// one of its dialects: MySQL (and MariaDB) or SQLite. It imports no
// database driver: bring the *sql.DB of your choice.
//
//	db, err := sql.Open("mysql", "app:pw@tcp(db:3306)/app?interpolateParams=true")
//	drv, err := sqldb.New(db, sqldb.MySQL)
//	c := locker.New(drv)
//
// For a URL instead (mysql://...), import the opener package
// github.com/lockerhq/locker/sqllock/mysql, which opens its own *sql.DB.
// With go-sql-driver/mysql, set interpolateParams=true as the opener
// does: without it every statement costs a round trip more (a prepare).
//
// Guarantees: a grant is one autocommitted INSERT of the name's row when
// the name is free (a DELETE of its expired row first when it is not), a
// release one DELETE of the token's row, so a released name leaves no row;
// fences from the table's AUTO_INCREMENT, so they only grow, across
// releases, expiry takeovers, Break and server restarts; expiry judged
// by the database's clock in the SQL, never the client's; refresh and
// release are token-checked; an acquisition whose caller gave up is undone
// after the database answered it (see the driver's write); refused
// credentials or privileges are errors wrapping backend.ErrPermission.
// The tables (locker_locks) are created on first use, or by your
// migrations (Dialect.SchemaSQL) with WithCreateTable(false).
//
// Limits: waiters in other processes poll (the core's backoff), there is
// no cross-process wake-up nor order; a lock is as available as the
// database (an asynchronous replica promoted can lose a recent grant, which
// the fence reveals); whoever can read the table reads the tokens.
// MySQL 8.0 or MariaDB 10.2.4 or later (their AUTO_INCREMENT survives a
// restart), InnoDB.
//
// How it works, in full: the repository's docs/backends/sqllock.md.
package sqldb
