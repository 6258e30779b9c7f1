package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/lockerhq/locker/backend"
)

// MySQL is the dialect of MySQL 8.0 or later and MariaDB 10.2.4 or later,
// with InnoDB tables: the versions whose AUTO_INCREMENT counter, which
// draws the fences, survives a server restart. Errors are read from their
// text ("Error 1062 ..."), as github.com/go-sql-driver/mysql writes them.
var MySQL = Dialect{
	name:       "mysql",
	tables:     mysqlTables,
	schema:     mysqlSchema,
	statements: mysqlStatements,
	classify:   mysqlClassify,
	check:      mysqlCheck,
	// READ COMMITTED: the anchor's lock serializes an object's
	// transactions, and REPEATABLE READ's gap locks would make those of
	// neighbouring names wait for, and deadlock with, one another.
	txIsolation: sql.LevelReadCommitted,
}

// mysqlNow is the server's clock in µs since 1970 UTC: integer arithmetic
// on UTC_TIMESTAMP, so that no session time zone or DATETIME/TIMESTAMP
// conversion enters. It is the statement's start, the same value wherever
// a statement uses it.
const mysqlNow = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// mysqlMaxIdent is MySQL's limit on a table name, less "_shared".
const mysqlMaxIdent = 64 - len(sharedSuffix)

func mysqlTables(name string) (lock, shared, why string) {
	if name == "" || len(name) > mysqlMaxIdent || !utf8.ValidString(name) ||
		strings.ContainsFunc(name, func(r rune) bool { return unicode.IsControl(r) || r == 0 }) ||
		strings.HasSuffix(name, " ") {
		return "", "", fmt.Sprintf("table name %q: want 1 to %d bytes of UTF-8 without control characters or a trailing space", name, mysqlMaxIdent)
	}
	q := func(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
	return q(name), q(name + sharedSuffix), ""
}

// The lock table: one row per held (or expired, not yet taken over) name;
// a release deletes it. The key is the name's bytes (VARBINARY: compared
// and sorted bytewise, and at most backend.MaxKeyLen bytes, well within
// InnoDB's index limit). fence draws from the table's AUTO_INCREMENT,
// which InnoDB keeps across restarts since MySQL 8.0 and MariaDB 10.2.4,
// so it grows for a name whose row came and went.
func mysqlSchema(lock, shared string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + lock + ` (
    name       VARBINARY(` + strconv.Itoa(backend.MaxKeyLen) + `) NOT NULL, -- namespace/name of the lock, UTF-8
    fence      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,  -- fencing token: new at every acquisition
    token      VARBINARY(64)   NOT NULL,                 -- the holder's secret
    owner      BLOB            NOT NULL,                 -- the holder's owner identity ('' for none)
    expires_us BIGINT          NOT NULL,                 -- server clock, µs since 1970 UTC
    PRIMARY KEY (name),
    UNIQUE KEY fence (fence)
) ENGINE=InnoDB`, `CREATE TABLE IF NOT EXISTS ` + shared + ` (
    name       VARBINARY(` + strconv.Itoa(backend.MaxKeyLen) + `) NOT NULL, -- namespace/name of the semaphore or read-write lock
    obj        TINYINT         NOT NULL,                 -- 1 semaphore, 2 read-write lock
    token      VARBINARY(64)   NOT NULL,                 -- the holder's secret ('' for the anchor)
    kind       TINYINT         NOT NULL,                 -- 0 anchor, 1 permit, 2 reader, 3 writer, 4 waiting writer
    fence      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,  -- fencing token
    owner      BLOB            NOT NULL,                 -- the holder's owner identity ('' for none)
    lim        INT             NOT NULL,                 -- a permit's semaphore limit (0 for the others)
    expires_us BIGINT          NOT NULL,                 -- server clock, µs since 1970 UTC
    PRIMARY KEY (name, obj, token),
    UNIQUE KEY fence (fence)
) ENGINE=InnoDB`}
}

func mysqlStatements(t, s string) statements {
	const now = mysqlNow
	// derived is a table b(i, name, token, fence, owner, us) of n rows of
	// arguments.
	derived := func(n int) string {
		var b strings.Builder
		b.WriteString("(SELECT ? AS i, ? AS name, ? AS token, ? AS fence, ? AS owner, ? AS us")
		for range n - 1 {
			b.WriteString(" UNION ALL SELECT ?, ?, ?, ?, ?, ?")
		}
		b.WriteString(") b")
		return b.String()
	}
	const match = ` ON l.name = b.name AND l.token = b.token AND (b.fence = 0 OR l.fence = b.fence) AND l.owner = b.owner`
	return statements{
		// INSERT ... SELECT, not VALUES: under innodb_autoinc_lock_mode
		// 0 or 1 (MariaDB's default) it holds the table's AUTO-INC lock
		// to the end of the statement, so that no insert draws a fence
		// and lands after another has drawn a higher one, been granted
		// and released (docs/backends/sqllock.md, MySQL and MariaDB).
		insert:    `INSERT INTO ` + t + ` (name, token, owner, expires_us) SELECT ?, ?, ?, ` + now + ` + ?`,
		takeover:  `DELETE FROM ` + t + ` WHERE name = ? AND (expires_us <= ` + now + ` OR token = ?)`,
		refresh:   `UPDATE ` + t + ` SET expires_us = ` + now + ` + ? WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND owner = ? AND expires_us > ` + now,
		release:   `DELETE FROM ` + t + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND expires_us > ` + now,
		forget:    `DELETE FROM ` + t + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?)`,
		inspect:   `SELECT owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name = ? AND expires_us > ` + now,
		list:      `SELECT name, owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name >= ? AND (? IS NULL OR name < ?) AND expires_us > ` + now + ` ORDER BY name LIMIT ?`,
		breakLock: `DELETE FROM ` + t + ` WHERE name = ? AND fence = ? AND expires_us > ` + now,
		refreshMany: func(n int) string {
			return `UPDATE ` + t + ` l JOIN ` + derived(n) + match + ` SET l.expires_us = ` + now + ` + b.us WHERE l.expires_us > ` + now
		},
		heldMany: func(n int) string {
			return `SELECT b.i FROM ` + t + ` l JOIN ` + derived(n) + match + ` WHERE l.expires_us > ` + now
		},
		sharedAnchor:     `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, '', 0, '', 0, 0) ON DUPLICATE KEY UPDATE kind = 0`,
		sharedLockAnchor: `SELECT 1 FROM ` + s + ` WHERE name = ? AND obj = ? AND token = '' FOR UPDATE`,
		sharedPurge:      `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0 AND (expires_us <= ` + now + ` OR token = ?)`,
		sharedRows:       `SELECT token, kind, lim FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0 AND expires_us > ` + now,
		// VALUES, not SELECT: the anchor's lock orders the fences of an
		// object, and an INSERT ... SELECT would take the table's AUTO-INC
		// lock while the transaction holds row locks (deadlocks, which
		// InnoDB reports as error 1467).
		sharedInsert:  `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, ?, ?, ?, ?, ` + now + ` + ?)`,
		sharedWait:    `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, ?, 4, ?, 0, ` + now + ` + ?) ON DUPLICATE KEY UPDATE kind = 4, expires_us = VALUES(expires_us)`,
		sharedRelease: `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?) AND expires_us > ` + now,
		sharedForget:  `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?)`,
		sharedCount:   `SELECT count(*) FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0`,
		sharedDrop:    `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND kind = 0`,
		sharedRefresh: `UPDATE ` + s + ` SET expires_us = ` + now + ` + ? WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?) AND owner = ? AND expires_us > ` + now,
		fences: func(n int) string {
			in := `name IN (?` + strings.Repeat(", ?", n-1) + `)`
			return `SELECT name, 1, fence, fence FROM ` + t + ` WHERE ` + in + ` AND expires_us > ` + now + `
UNION ALL SELECT name, count(*), max(fence), bit_xor(fence) FROM ` + s + ` WHERE ` + in + ` AND kind > 0 AND expires_us > ` + now + ` GROUP BY name`
		},
		// The hint makes MySQL 8 read the live counters, not its cached
		// statistics; MariaDB reads them live and ignores the hint.
		counter: `SELECT /*+ SET_VAR(information_schema_stats_expiry=0) */ sum(AUTO_INCREMENT) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (` +
			mysqlString(t) + `, ` + mysqlString(s) + `)`,
		// 6 arguments a claim, within the 65535 of a prepared statement.
		maxBatch: 1000,
	}
}

// mysqlString is the quoted table name q as a string literal of its
// name.
func mysqlString(q string) string {
	name := strings.ReplaceAll(q[1:len(q)-1], "``", "`")
	return "'" + strings.ReplaceAll(strings.ReplaceAll(name, `\`, `\\`), "'", "''") + "'"
}

// mysqlClassify reads the error number that MySQL and MariaDB put in
// every error, as go-sql-driver/mysql writes it ("Error 1062 (23000):
// ..."): the engine imports no driver, so it reads the text.
func mysqlClassify(err error) errKind {
	msg := err.Error()
	rest, ok := strings.CutPrefix(msg, "Error ")
	if !ok {
		return errOther
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end <= 0 {
		return errOther
	}
	switch rest[:end] {
	case "1062": // ER_DUP_ENTRY
		return errDuplicate
	case "1044", "1045", "1142", "1143", "1227", "1370", "1698": // access or command denied
		return errPermission
	case "1205", "1467": // lock wait timeout; a deadlock on an AUTO-INC lock
		return errBusy
	case "1213": // deadlock
		return errDeadlock
	case "1146": // no such table
		return errNoTable
	}
	return errOther
}

// mysqlCheck refuses servers whose fences could go back: those whose
// AUTO_INCREMENT counter a restart can set back (to max(fence)+1, 1 for
// an empty table): MySQL before 8.0, MariaDB before 10.2.4; and those in
// innodb_autoinc_lock_mode 2 (MySQL 8's default), where an insert can
// draw its fence, stall, and land after another one drew a higher fence
// for the same name, was granted and released. In modes 0 and 1 an
// INSERT ... SELECT holds the table's AUTO-INC lock from its draw to its
// end, which rules that out.
func mysqlCheck(ctx context.Context, db *sql.DB) error {
	var (
		v    string
		mode int
	)
	if err := db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_autoinc_lock_mode`).Scan(&v, &mode); err != nil {
		return err
	}
	if !mysqlPersistsCounter(v) {
		return fmt.Errorf("%w: server version %s: want MySQL 8.0 or MariaDB 10.2.4 or later, whose AUTO_INCREMENT counters, the fences, survive a restart", backend.ErrUnsupported, v)
	}
	if mode == 2 {
		return fmt.Errorf("%w: innodb_autoinc_lock_mode=2 lets a fence be drawn before, and land after, a higher one: start the server with innodb_autoinc_lock_mode=1 (MariaDB's default)", backend.ErrUnsupported)
	}
	return nil
}

// mysqlPersistsCounter reports whether the server of version v keeps
// AUTO_INCREMENT counters across restarts.
func mysqlPersistsCounter(v string) bool {
	var nums [3]int
	rest := v
	for i := range nums {
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(rest)
		}
		nums[i], _ = strconv.Atoi(rest[:end])
		rest = rest[end:]
		if !strings.HasPrefix(rest, ".") {
			break
		}
		rest = rest[1:]
	}
	if strings.Contains(strings.ToLower(v), "mariadb") {
		return nums[0] > 10 || nums[0] == 10 && (nums[1] > 2 || nums[1] == 2 && nums[2] >= 4)
	}
	return nums[0] >= 8
}
