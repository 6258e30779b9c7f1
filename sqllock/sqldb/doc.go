// Package sqldb keeps locks in a table of any database/sql database, in
// one of its dialects: MySQL (and MariaDB) or SQLite. It imports no
// database driver: bring the *sql.DB of your choice.
//
//	db, err := sql.Open("mysql", "app:pw@tcp(db:3306)/app?interpolateParams=true")
//	drv, err := sqldb.New(db, sqldb.MySQL)
//	c := locker.New(drv)
//
// New never closes db. Open is New for a *sql.DB made for the driver
// alone, which it checks at once and closes on Close: what the URL
// openers use. For a URL (mysql://...), import the opener package
// github.com/lockerhq/locker/sqllock/mysql. With go-sql-driver/mysql, set
// interpolateParams=true as the opener does: without it every statement
// costs a round trip more (a prepare).
//
// Guarantees: a grant is one autocommitted statement (MySQL: an INSERT
// ... ON DUPLICATE KEY UPDATE that takes the name's row when it is free),
// a release one UPDATE or DELETE of the token's row; fences strictly
// increase per name across releases, expiry takeovers, Break and server
// restarts (MySQL: the server's clock in µs, or the last fence + 1, kept
// in the released row for the retention, a minute by default, after which
// the row goes); expiry judged by the database's clock in the SQL, never
// the client's; refresh and release are token-checked; an acquisition
// whose caller gave up is undone after the database answered it (see the
// driver's write); refused credentials or privileges are errors wrapping
// backend.ErrPermission.
// Semaphores and read-write locks live in a second table. The tables
// (locker_locks, locker_locks_shared) are created on first use, or by your
// migrations (Dialect.SchemaSQL) with WithCreateTable(false).
//
// Waiters are woken at once by this driver's releases, and by others'
// through a poll every 50 ms while someone waits (no LISTEN/NOTIFY); no
// order between them.
//
// Limits: a lock is as available as the database (an asynchronous
// replica promoted can lose a recent grant, which the fence reveals);
// whoever can read the table reads the tokens. MySQL 8.0 or MariaDB
// 10.2.4 or later (their AUTO_INCREMENT, which draws the semaphores'
// fences, survives a restart), InnoDB; a lock's fence is only as
// monotonic as the server's clock beyond the retention (a step back of
// more than that after a name's row went).
//
// How it works, in full: the repository's docs/backends/sqllock.md.
package sqldb
