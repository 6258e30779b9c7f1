// Package mysql opens the sqldb lock engine on MySQL or MariaDB from a
// URL, through github.com/go-sql-driver/mysql. A blank import registers
// the scheme:
//
//	import _ "github.com/lockerhq/locker/sqllock/mysql"
//
//	c, err := locker.Open(ctx, "mysql://app@db.example.com:3306/app?ca=/etc/ssl/db-ca.pem")
//
//	mysql://user[:password]@host[:port]/database[?params]
//
// The password comes from the URL or, when it has none, from MYSQL_PWD as
// with the mysql client. TLS, as on every secured backend: tls=true, ca=,
// cert=, key=, server_name=, skip_verify= (tests only); without them the
// connection is plain TCP, and a password sent so to a host that is not
// loopback is warned of. Parameters of our own:
//
//	lock_table=NAME     the table (default locker_locks)
//	create_table=false  do not create the table; only check it exists
//	retention=1m        how long a released lock's row (its fence) stays
//	connect_timeout=10s, read_timeout=, write_timeout=  go-sql-driver's timeouts
//
// Any other parameter is an error wrapping backend.ErrInvalidURL, before
// any network call. Guarantees and limits are the engine's (package
// sqldb); with a *sql.DB of your own, use sqldb.New(db, sqldb.MySQL).
//
// This package is apart from sqldb so that programs that do not use MySQL
// compile no MySQL driver: it adds github.com/go-sql-driver/mysql and
// filippo.io/edwards25519 to a build.
package mysql
