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
	"github.com/lockerhq/locker/sqllock/internal/lim"
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

// The lock table: one row per name, which a release leaves as a
// tombstone keeping the fence for the retention (purge deletes it then).
// The key is the name's bytes (VARBINARY: compared and sorted bytewise,
// and at most backend.MaxKeyLen bytes, well within InnoDB's index limit).
// The shared table: see shared.go; its fences draw from its
// AUTO_INCREMENT, which InnoDB keeps across restarts since MySQL 8.0 and
// MariaDB 10.2.4.
func mysqlSchema(lock, shared string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + lock + ` (
    name       VARBINARY(` + strconv.Itoa(backend.MaxKeyLen) + `) NOT NULL, -- namespace/name of the lock, UTF-8
    fence      BIGINT          NOT NULL,                 -- fencing token: max(last + 1, server clock µs) at every grant
    token      VARBINARY(64)   NOT NULL,                 -- the holder's secret ('' once released)
    owner      BLOB            NOT NULL,                 -- the holder's owner identity ('' for none)
    expires_us BIGINT          NOT NULL,                 -- server clock, µs since 1970 UTC (the release's time once released)
    PRIMARY KEY (name)
) ENGINE=InnoDB`, `CREATE TABLE IF NOT EXISTS ` + shared + ` (
    name       VARBINARY(` + strconv.Itoa(backend.MaxKeyLen) + `) NOT NULL, -- namespace/name of the semaphore or read-write lock
    obj        TINYINT         NOT NULL,                 -- 1 semaphore, 2 read-write lock
    token      VARBINARY(64)   NOT NULL,                 -- the holder's secret ('' for the anchor)
    kind       TINYINT         NOT NULL,                 -- 0 anchor, 1 permit, 2 reader, 3 writer, 4 waiting writer, 5 limit
    fence      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,  -- fencing token
    owner      BLOB            NOT NULL,                 -- the holder's owner identity ('' for none)
    lim        INT             NOT NULL,                 -- a permit's semaphore limit, plus 16384 for each permit it takes beyond one (0 for the others)
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
	// took is true in the assignments after fence's when the grant took
	// the row: LAST_INSERT_ID(x) sets what LAST_INSERT_ID() returns for
	// the rest of the statement, the new fence or 0, never a row's fence.
	const took = `fence = LAST_INSERT_ID()`
	return statements{
		// One statement: insert the name's row, or take the existing one
		// if it is free (released, expired) or the token's own. The fence
		// is the server's clock in µs, or the last fence + 1 if that is
		// higher, computed under the row's lock: a released row stays,
		// as a tombstone, for the retention, so that an insert that read
		// the clock and stalled meets it and draws above. LAST_INSERT_ID
		// returns the fence, and 0 when the row was held (set in the
		// VALUES, reset when the update keeps the row). ON DUPLICATE KEY
		// UPDATE assigns left to right, each seeing the earlier ones:
		// fence decides, and the others follow it (took), so that the
		// server parses and evaluates the clock and the condition once.
		insert: `INSERT INTO ` + t + ` (name, token, owner, expires_us, fence) VALUES (?, ?, ?, ` + now + ` + ?, LAST_INSERT_ID(` + now + `))
ON DUPLICATE KEY UPDATE
    fence = IF(expires_us <= ` + now + ` OR token = VALUES(token), LAST_INSERT_ID(GREATEST(fence + 1, ` + now + `)), fence + 0 * LAST_INSERT_ID(0)),
    token = IF(` + took + `, VALUES(token), token), owner = IF(` + took + `, VALUES(owner), owner),
    expires_us = IF(` + took + `, VALUES(expires_us), expires_us)`,
		refresh: `UPDATE ` + t + ` SET expires_us = ` + now + ` + ? WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND owner = ? AND expires_us > ` + now,
		// A release leaves the row as a tombstone, with its fence.
		release:   `UPDATE ` + t + ` SET token = '', owner = '', expires_us = ` + now + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND expires_us > ` + now,
		forget:    `UPDATE ` + t + ` SET token = '', owner = '', expires_us = LEAST(expires_us, ` + now + `) WHERE name = ? AND token = ? AND (? = 0 OR fence = ?)`,
		inspect:   `SELECT owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name = ? AND expires_us > ` + now,
		list:      `SELECT name, owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name >= ? AND (? IS NULL OR name < ?) AND expires_us > ` + now + ` ORDER BY name LIMIT ?`,
		breakLock: `UPDATE ` + t + ` SET token = '', owner = '', expires_us = ` + now + ` WHERE name = ? AND fence = ? AND expires_us > ` + now,
		// Tombstones, and rows expired, for longer than the retention.
		purge: `DELETE FROM ` + t + ` WHERE expires_us < ` + now + ` - ? LIMIT 1000`,
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
		sharedList: `SELECT name, kind, owner, fence, lim, expires_us - ` + now + ` FROM ` + s + `
WHERE obj = ? AND name >= ? AND (? IS NULL OR name < ?) AND (name > ? OR fence > ?) AND kind BETWEEN 1 AND 3 AND expires_us > ` + now + `
ORDER BY name, fence LIMIT ?`,
		sharedBreak:  `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND fence = ? AND kind BETWEEN 1 AND 3 AND expires_us > ` + now,
		sharedResize: `UPDATE ` + s + ` SET lim = ? + lim - lim % ` + strconv.Itoa(lim.Step) + ` WHERE name = ? AND obj = ? AND kind = 1`,
		fences: func(n int) string {
			in := `name IN (?` + strings.Repeat(", ?", n-1) + `)`
			return `SELECT name, expires_us > ` + now + `, fence, fence FROM ` + t + ` WHERE ` + in + `
UNION ALL SELECT name, count(*), max(fence), bit_xor(fence) FROM ` + s + ` WHERE ` + in + ` AND kind > 0 AND expires_us > ` + now + ` GROUP BY name`
		},
		// The shared table's: the lock table's tombstones show a name
		// taken and freed between two looks. The hint makes MySQL 8 read
		// the live counter, not its cached statistics; MariaDB reads it
		// live and ignores the hint.
		counter: `SELECT /*+ SET_VAR(information_schema_stats_expiry=0) */ AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ` + mysqlString(s),
		// 6 arguments a claim, within the 65535 of a prepared statement.
		maxBatch: 1000,

		// A set's rows, inserted or taken in one statement, which a name
		// held undoes whole: raise fails it (an error whatever the
		// sql_mode: BIGINT UNSIGNED overflow), and InnoDB rolls back a
		// failed statement. Every name's fence is the clock, which
		// LAST_INSERT_ID returns: a row whose fence is not below it (taken
		// in the same µs, a clock set back) fails the set too, and the
		// core then takes its names one by one, whose grants draw above.
		grantMany: func(n int) string {
			row := `(?, ?, ?, ` + now + ` + ?, LAST_INSERT_ID(` + now + `))`
			return `INSERT INTO ` + t + ` (name, token, owner, expires_us, fence) VALUES ` + row + strings.Repeat(", "+row, n-1) + `
ON DUPLICATE KEY UPDATE
    fence = IF((expires_us <= ` + now + ` OR token = VALUES(token)) AND fence < ` + now + `, ` + now + `, ` + mysqlRaise + `),
    token = VALUES(token), owner = VALUES(owner), expires_us = VALUES(expires_us)`
		},
		// fence is assigned first, so that the condition reads the row as
		// it was.
		releaseMany: func(n int) string {
			return `UPDATE ` + t + ` SET fence = IF((name, token, fence) IN ((?, ?, ?)` + strings.Repeat(", (?, ?, ?)", n-1) + `) AND expires_us > ` + now + `, fence, ` + mysqlRaise + `),
    token = '', owner = '', expires_us = ` + now + ` WHERE name IN (?` + strings.Repeat(", ?", n-1) + `)`
		},
		// A freed name's tombstone keeps the claim's fence; a row made
		// since draws a higher one.
		releasedMany: func(n int) string {
			return `SELECT name FROM ` + t + ` WHERE (name, fence) IN ((?, ?)` + strings.Repeat(", (?, ?)", n-1) + `) AND token = ''`
		},

		floorInsert: `INSERT INTO ` + t + ` (name, token, owner, expires_us, fence) VALUES (?, ?, '', 0, 0)`,
		floorDelete: `DELETE FROM ` + t + ` WHERE name = ? AND token = ?`,
	}
}

// mysqlRaise fails the statement that evaluates it (error 1690, which
// mysqlClassify reads as errRaised) on any row, fence 0 too (the raw
// floor's): fence is a column, not folded as a constant, and IF evaluates
// only the branch it takes.
const mysqlRaise = `~0 + (fence + 1)`

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
	case "1690": // out of range: mysqlRaise
		return errRaised
	case "1146": // no such table
		return errNoTable
	}
	return errOther
}

// mysqlCheck refuses servers whose AUTO_INCREMENT counter, which draws
// the fences of semaphores and read-write locks, a restart can set back
// (to max(fence)+1, 1 for an empty table): MySQL before 8.0, MariaDB
// before 10.2.4. (Those fences are drawn under the object's anchor lock,
// so innodb_autoinc_lock_mode does not matter; the locks' fences come
// from the clock and the tombstones.)
func mysqlCheck(ctx context.Context, db *sql.DB) error {
	var v string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&v); err != nil {
		return err
	}
	if !mysqlPersistsCounter(v) {
		return fmt.Errorf("%w: server version %s: want MySQL 8.0 or MariaDB 10.2.4 or later, whose AUTO_INCREMENT counters, the fences of semaphores, survive a restart", backend.ErrUnsupported, v)
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
