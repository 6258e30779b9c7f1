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

// SQLite is the dialect of SQLite 3.35 or later, through any database/sql
// driver (modernc.org/sqlite, as the sqlite:// opener uses,
// github.com/mattn/go-sqlite3, github.com/ncruces/go-sqlite3...). Every
// process that shares the file must reach it on a local file system; open
// it in WAL mode with a busy timeout, as the opener does. Errors are read
// from SQLite's own messages, which every driver passes on.
var SQLite = Dialect{
	name:       "sqlite",
	tables:     sqliteTables,
	schema:     sqliteSchema,
	statements: sqliteStatements,
	classify:   sqliteClassify,
	inProcess:  true,
	oneWriter:  true,
	writerKey:  sqliteFile,
	check:      sqliteCheck,
}

// sqliteNow is the host's clock in µs since 1970 UTC. SQLite reads it in
// whole milliseconds, truncated, and keeps one value for the whole
// statement; julianday, not unixepoch('subsec'), for SQLite before 3.42.
// A double of days holds the milliseconds exactly (2^53 is far), so
// round() only undoes the binary fraction.
const sqliteNow = `(CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000)`

// sqliteTick is the clock's step, in µs. An expiry is set one step later
// than now + TTL, so that a lock taken just before the clock ticked still
// lives its whole TTL: the truncated now may be up to a step behind.
const sqliteTick = `1000`

// sqliteMaxIdent bounds a table name (SQLite has no limit of its own), less
// "_shared".
const sqliteMaxIdent = 64 - len(sharedSuffix)

func sqliteTables(name string) (lock, shared, why string) {
	if name == "" || len(name) > sqliteMaxIdent || !utf8.ValidString(name) ||
		strings.ContainsFunc(name, unicode.IsControl) || strings.HasPrefix(strings.ToLower(name), "sqlite_") {
		return "", "", fmt.Sprintf("table name %q: want 1 to %d bytes of UTF-8 without control characters, not starting with sqlite_", name, sqliteMaxIdent)
	}
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	return q(name), q(name + sharedSuffix), ""
}

// The lock table: one row per held (or expired, not yet taken over) name;
// a release deletes it. fence is the rowid, drawn by AUTOINCREMENT, which
// never reuses a value (SQLite keeps the largest in sqlite_sequence, in
// the same transaction): so fences grow for a name whose row came and
// went, across restarts. Names are TEXT compared bytewise (BINARY
// collation); STRICT tables would need 3.37. The shared table, for
// semaphores and read-write locks, has a row per holder, per waiting
// writer and per object (its anchor, with an empty token), and draws
// its fences the same way.
func sqliteSchema(lock, shared string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + lock + ` (
    fence      INTEGER PRIMARY KEY AUTOINCREMENT, -- fencing token: new at every acquisition
    name       TEXT    NOT NULL UNIQUE,           -- namespace/name of the lock, UTF-8
    token      TEXT    NOT NULL,                  -- the holder's secret
    owner      TEXT    NOT NULL,                  -- the holder's owner identity ('' for none)
    expires_us INTEGER NOT NULL                   -- host clock, µs since 1970 UTC
)`, `CREATE TABLE IF NOT EXISTS ` + shared + ` (
    fence      INTEGER PRIMARY KEY AUTOINCREMENT, -- fencing token
    name       TEXT    NOT NULL,                  -- namespace/name of the semaphore or read-write lock
    obj        INTEGER NOT NULL,                  -- 1 semaphore, 2 read-write lock
    token      TEXT    NOT NULL,                  -- the holder's secret ('' for the anchor)
    kind       INTEGER NOT NULL,                  -- 0 anchor, 1 permit, 2 reader, 3 writer, 4 waiting writer, 5 limit
    owner      TEXT    NOT NULL,                  -- the holder's owner identity ('' for none)
    lim        INTEGER NOT NULL,                  -- a permit's semaphore limit, plus 16384 for each permit it takes beyond one (0 for the others)
    expires_us INTEGER NOT NULL,                  -- host clock, µs since 1970 UTC
    UNIQUE (name, obj, token)
)`}
}

// sqliteStatements: SQLite runs one write at a time for the whole
// database, and a write statement takes the write lock before it reads,
// so each statement below is atomic, reads included, without a
// transaction. The shared table's transactions (a grant, a release)
// begin with a write, sharedAnchor or sharedLockAnchor, which takes the
// database's write lock for the rest of the transaction: the anchor's
// lock of MySQL, for the whole file. Beginning with a read would let
// another writer commit in between, and the transaction's first write
// would then fail at once (SQLITE_BUSY_SNAPSHOT), the busy timeout unused.
func sqliteStatements(t, s string) statements {
	const now = sqliteNow
	const until = now + ` + ` + sqliteTick + ` + ?`
	// values is a table b(i, name, token, fence, owner, us) of n rows of
	// arguments.
	values := func(n int) string {
		var b strings.Builder
		b.WriteString("WITH b(i, name, token, fence, owner, us) AS (VALUES (?, ?, ?, ?, ?, ?)")
		for range n - 1 {
			b.WriteString(", (?, ?, ?, ?, ?, ?)")
		}
		b.WriteString(") ")
		return b.String()
	}
	const match = `l.name = b.name AND l.token = b.token AND (b.fence = 0 OR l.fence = b.fence) AND l.owner = b.owner AND l.expires_us > ` + now
	return statements{
		insert:   `INSERT INTO ` + t + ` (name, token, owner, expires_us) VALUES (?, ?, ?, ` + until + `)`,
		takeover: `DELETE FROM ` + t + ` WHERE name = ? AND (expires_us <= ` + now + ` OR token = ?)`,
		refresh:  `UPDATE ` + t + ` SET expires_us = ` + until + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND owner = ? AND expires_us > ` + now,
		release:  `DELETE FROM ` + t + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?) AND expires_us > ` + now,
		forget:   `DELETE FROM ` + t + ` WHERE name = ? AND token = ? AND (? = 0 OR fence = ?)`,
		inspect:  `SELECT owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name = ? AND expires_us > ` + now,
		// hi is a []byte: a BLOB sorts after every TEXT in SQLite, so it
		// is compared as TEXT, bytewise all the same.
		list:      `SELECT name, owner, fence, expires_us - ` + now + ` FROM ` + t + ` WHERE name >= ? AND (? IS NULL OR name < CAST(? AS TEXT)) AND expires_us > ` + now + ` ORDER BY name LIMIT ?`,
		breakLock: `DELETE FROM ` + t + ` WHERE name = ? AND fence = ? AND expires_us > ` + now,
		// UPDATE ... FROM: SQLite 3.33.
		refreshMany: func(n int) string {
			return values(n) + `UPDATE ` + t + ` AS l SET expires_us = ` + now + ` + ` + sqliteTick + ` + b.us FROM b WHERE ` + match
		},
		heldMany: func(n int) string {
			return values(n) + `SELECT b.i FROM ` + t + ` AS l JOIN b ON ` + match
		},
		sharedAnchor: `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, '', 0, '', 0, 0) ON CONFLICT (name, obj, token) DO NOTHING`,
		// UPDATE ... RETURNING, not SELECT: see above (RETURNING: 3.35).
		sharedLockAnchor: `UPDATE ` + s + ` SET kind = 0 WHERE name = ? AND obj = ? AND token = '' RETURNING 1`,
		sharedPurge:      `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0 AND (expires_us <= ` + now + ` OR token = ?)`,
		sharedRows:       `SELECT token, kind, lim FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0 AND expires_us > ` + now,
		sharedInsert:     `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, ?, ?, ?, ?, ` + until + `)`,
		sharedWait: `INSERT INTO ` + s + ` (name, obj, token, kind, owner, lim, expires_us) VALUES (?, ?, ?, 4, ?, 0, ` + until + `)
ON CONFLICT (name, obj, token) DO UPDATE SET kind = 4, expires_us = excluded.expires_us`,
		sharedRelease: `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?) AND expires_us > ` + now,
		sharedForget:  `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?)`,
		sharedCount:   `SELECT count(*) FROM ` + s + ` WHERE name = ? AND obj = ? AND kind > 0`,
		sharedDrop:    `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND kind = 0`,
		sharedRefresh: `UPDATE ` + s + ` SET expires_us = ` + until + ` WHERE name = ? AND obj = ? AND token = ? AND kind = ? AND (? = 0 OR fence = ?) AND owner = ? AND expires_us > ` + now,
		sharedList: `SELECT name, kind, owner, fence, lim, expires_us - ` + now + ` FROM ` + s + `
WHERE obj = ? AND name >= ? AND (? IS NULL OR name < CAST(? AS TEXT)) AND (name > ? OR fence > ?) AND kind BETWEEN 1 AND 3 AND expires_us > ` + now + `
ORDER BY name, fence LIMIT ?`,
		sharedBreak:  `DELETE FROM ` + s + ` WHERE name = ? AND obj = ? AND fence = ? AND kind BETWEEN 1 AND 3 AND expires_us > ` + now,
		sharedResize: `UPDATE ` + s + ` SET lim = ? + lim - lim % ` + strconv.Itoa(lim.Step) + ` WHERE name = ? AND obj = ? AND kind = 1`,
		fences: func(n int) string {
			in := `name IN (?` + strings.Repeat(", ?", n-1) + `)`
			return `SELECT name, 1, fence, fence FROM ` + t + ` WHERE ` + in + ` AND expires_us > ` + now + `
UNION ALL SELECT name, count(*), max(fence), ` + sqliteXor + ` FROM ` + s + ` WHERE ` + in + ` AND kind > 0 AND expires_us > ` + now + ` GROUP BY name`
		},
		// The AUTOINCREMENT high marks of both tables, 0 before their
		// first grant.
		counter: `SELECT coalesce((SELECT sum(seq) FROM sqlite_sequence WHERE name IN (` + sqliteString(t) + `, ` + sqliteString(s) + `)), 0)`,
		// 6 arguments a claim, within the 32766 that SQLite allows by
		// default since 3.32.
		maxBatch: 1000,

		// A set's: one statement is atomic, so a name held (UNIQUE) fails
		// the insert whole, as TryAcquire's.
		grantMany: func(n int) string {
			row := `(?, ?, ?, ` + until + `)`
			return `INSERT INTO ` + t + ` (name, token, owner, expires_us) VALUES ` + row + strings.Repeat(", "+row, n-1) + ` RETURNING name, fence`
		},
		takeoverMany: func(n int) string {
			return `WITH b(name, token, owner, us) AS (VALUES (?, ?, ?, ?)` + strings.Repeat(", (?, ?, ?, ?)", n-1) + `)
DELETE FROM ` + t + ` WHERE name IN (SELECT name FROM b) AND (expires_us <= ` + now + ` OR (name, token) IN (SELECT name, token FROM b))`
		},
		releaseMany: func(n int) string {
			return `WITH b(name, token, fence) AS (VALUES (?, ?, ?)` + strings.Repeat(", (?, ?, ?)", n-1) + `)
DELETE FROM ` + t + ` WHERE name IN (?` + strings.Repeat(", ?", n-1) + `) AND (name, token, fence) IN (SELECT name, token, fence FROM b) AND expires_us > ` + now + ` RETURNING name`
		},
		returning: true,

		floorInsert: `INSERT INTO ` + t + ` (name, token, owner, expires_us) VALUES (?, ?, '', 0)`,
		floorDelete: `DELETE FROM ` + t + ` WHERE name = ? AND token = ?`,
	}
}

// sqliteClassify reads SQLite's messages (sqlite3_errstr and
// sqlite3_errmsg), which modernc.org/sqlite, mattn/go-sqlite3 and
// ncruces/go-sqlite3 all carry: the engine imports no driver.
func sqliteClassify(err error) errKind {
	msg := err.Error()
	has := func(s string) bool { return strings.Contains(msg, s) }
	switch {
	case has("UNIQUE constraint failed"):
		return errDuplicate
	case has("database is locked"), has("database table is locked"), has("database schema is locked"):
		return errBusy // SQLITE_BUSY, SQLITE_LOCKED: the busy timeout ran out
	case has("no such table"):
		return errNoTable
	case has("attempt to write a readonly database"), has("access permission denied"), has("authorization denied"):
		return errPermission // SQLITE_READONLY (a file or directory this process may not write), SQLITE_PERM, SQLITE_AUTH
	}
	return errOther
}

// sqliteString is the SQL string literal of the unquoted name of the
// quoted table t, as sqlite_sequence keeps it.
func sqliteString(t string) string {
	return `'` + strings.ReplaceAll(strings.ReplaceAll(t[1:len(t)-1], `""`, `"`), "'", "''") + `'`
}

// sqliteXor stands for the XOR of a group's fences, which SQLite cannot
// compute cheaply (no XOR operator, no bitwise aggregate; the bit-by-bit
// parity took a third of the suite's CPU to prepare, at every poll): their
// sum. The poller only compares the value between two looks, and with the
// count and the highest fence it tells every change of a group already,
// since a new holder's fence is above every fence before it.
const sqliteXor = `sum(fence)`

// sqliteFile returns the absolute path of db's main database file, the
// key of the process-wide write gate: every writer of one file in this
// process queues in Go, whatever *sql.DB it uses ("" for an in-memory
// database: the driver's own gate).
func sqliteFile(ctx context.Context, db *sql.DB) (string, error) {
	var file string
	err := db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file)
	return file, err
}

// sqliteCheck refuses SQLite before 3.35, which lacks RETURNING (3.35)
// and UPDATE ... FROM (3.33).
func sqliteCheck(ctx context.Context, db *sql.DB) error {
	var v string
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return err
	}
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil || major < 3 || major == 3 && minor < 35 {
		return fmt.Errorf("%w: SQLite %s: want 3.35 or later (RETURNING)", backend.ErrUnsupported, v)
	}
	return nil
}
