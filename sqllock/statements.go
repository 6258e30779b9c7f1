package sqllock

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SchemaSQL is the DDL of the lock table with its default name,
// locker_locks: the contents of schema.sql, for migrations.
//
//go:embed schema.sql
var SchemaSQL string

// defaultTable is the table name in SchemaSQL.
const defaultTable = "locker_locks"

// statements holds every SQL statement the driver runs on one lock table,
// each documented where newStatements makes it, so that the driver's logic
// reads without SQL. Durations are whole microseconds; all time arithmetic
// uses the server's clock.
type statements struct {
	table      string // quoted, possibly schema-qualified
	fenceClass int32  // the first key of the table's fence locks (classOf)
	// presenceClass is the first key of the advisory locks that make a
	// key present (listen.go), the second hashtext(key).
	presenceClass int32
	channel       string // the table's notification channel

	listen, exists, schemaExists, createLock, createSchema, createTable, fenced, migrate string

	acquire, acquireMany, refresh, refreshMany, release, releaseMany, notifyKey, initNotifyKey, inspect, list, breakLock string
	presenceLock, presenceUnlock, floorInsert, floorDelete                                                               string
}

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, silently, so we refuse them.
const maxIdentLen = 63

// quoteIn returns the quoted name, qualified with schema unless that is
// empty, and schema.table unquoted: the seed of the table's hashes.
func quoteIn(schema, name, table string) (quoted, qualified string) {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize(), table
	}
	return pgx.Identifier{schema, name}.Sanitize(), schema + "." + table
}

// fit returns name if PostgreSQL keeps it whole, else prefix and a hash
// of seed.
func fit(name, prefix, seed string) string {
	if len(name) <= maxIdentLen {
		return name
	}
	sum := sha256.Sum256([]byte(seed))
	return prefix + hex.EncodeToString(sum[:16])
}

func newStatements(schema, table string) statements {
	t, qualified := quoteIn(schema, table, table)
	// The channel, the notification key's row and the creation lock keep
	// the package's former name, sqllock, so that tables made, and
	// processes run, before the rename to sqllock keep working with it.
	channel := fit("sqllock:"+qualified, "sqllock:", qualified)
	class, presence := classOf("fence", qualified), classOf("presence", qualified)
	fenceClass, presenceClass := strconv.Itoa(int(class)), strconv.Itoa(int(presence))
	// take is the upsert of acquire and acquireMany, and free its
	// condition: a free or expired row, or the token's own, is taken anew,
	// with a new fence.
	take := `ON CONFLICT (name) DO UPDATE
SET token = excluded.token, owner = excluded.owner, version = DEFAULT,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE `
	free := `l.token IS NULL OR l.expires_at <= clock_timestamp() OR l.token = excluded.token`
	d := statements{
		table:         t,
		fenceClass:    class,
		presenceClass: presence,
		channel:       channel,
		listen:        "LISTEN " + pgx.Identifier{channel}.Sanitize(),
		// exists($1 table) and schemaExists($1 schema) return one boolean.
		exists:       `SELECT to_regclass($1) IS NOT NULL`,
		schemaExists: `SELECT to_regnamespace($1) IS NOT NULL`,
		// createLock($1 int8) serializes schema creation between
		// processes, for the rest of the transaction.
		createLock:  `SELECT pg_advisory_xact_lock($1)`,
		createTable: schemaFor(t),
		// fenced($1 table) returns one boolean: the table's version column
		// draws from a sequence (tables made before it did not); migrate
		// makes it do so (see MigrationSQL).
		fenced:  `SELECT coalesce((SELECT attidentity <> '' FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'version'), false)`,
		migrate: migrationFor(t),
		// acquire($1 key, $2 token, $3 owner, $4 ttl µs) returns the new
		// version when the key was free, expired or already the token's; no
		// row when another token holds it. The fence (the column's default)
		// is drawn under the name's shared fence lock, which a release takes
		// exclusively (docs/backends/sqllock.md, The table).
		acquire: `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT $1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond'
WHERE pg_advisory_xact_lock_shared(` + fenceClass + `, hashtext($1)) IS NOT NULL
` + take + free + `
RETURNING version`,
		// acquireMany($1 keys, $2 tokens, $3 owners, $4 ttls µs, arrays of
		// one length) is acquire for every element, all or none: each key
		// and its version when it took all, and division_by_zero as soon as
		// it finds a key held, the one way a plain statement rolls itself
		// back (rather than by a count of the rows taken, which took a CTE
		// and a window, more work for the server); l.version - l.version is
		// a zero the planner does not fold, as it would 1 / 0. Keys come in
		// byte order, so two sets take their fence locks in one order.
		acquireMany: `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT w.name, w.token, nullif(w.owner, ''), clock_timestamp(), clock_timestamp() + w.us * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) AS w(name, token, owner, us)
WHERE pg_advisory_xact_lock_shared(` + fenceClass + `, hashtext(w.name)) IS NOT NULL
` + take + `CASE WHEN ` + free + ` THEN true ELSE 1 / (l.version - l.version) = 0 END
RETURNING name, version`,
		// refresh($1 key, $2 token, $3 fence or 0, $4 ttl µs, $5 owner)
		// extends a live lock of the token, no row otherwise; a rewritten
		// owner reads as a theft.
		refresh: `UPDATE ` + t + `
SET expires_at = clock_timestamp() + $4::int8 * interval '1 microsecond'
WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND expires_at > clock_timestamp()
    AND owner IS NOT DISTINCT FROM nullif($5, '')`,
		// refreshMany($1 keys, $2 tokens, $3 fences, $4 ttls µs, $5 owners,
		// arrays of one length) is refresh for each element, and returns
		// the 1-based positions of those it extended.
		refreshMany: `UPDATE ` + t + ` AS l
SET expires_at = clock_timestamp() + b.us * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[]) WITH ORDINALITY AS b(name, token, fence, us, owner, i)
WHERE l.name = b.name AND l.token = b.token AND (b.fence = 0 OR l.version = b.fence)
    AND l.expires_at > clock_timestamp() AND l.owner IS NOT DISTINCT FROM nullif(b.owner, '')
RETURNING b.i`,
		// release($1 key, $2 token, $3 fence or 0, $4 channel, $5 the key's
		// notifyPayload) deletes the token's row, so that nothing of the
		// name stays, and returns whether it was live, and true
		// (notifyIfPresent's); no row without one. No CTE: one plan node.
		// The fence lock is taken in the scan's filter, after the token
		// matched and before the row is locked, so that no acquirer waits
		// for this row while holding it.
		release: `DELETE FROM ` + t + `
WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3)
    AND pg_advisory_xact_lock(` + fenceClass + `, hashtext($1)) IS NOT NULL
RETURNING expires_at > clock_timestamp(), ` + notifyIfPresent("$4", "$5", presenceClass, "name"),
		// releaseMany($1 keys, $2 tokens, $3 fences or 0, $4 channel, $5
		// the keys' notifyPayloads) is release for each element, and returns
		// each deleted row's key with release's columns. The CASE keeps
		// release's order, whatever the scan: a fence lock only once token
		// and fence matched.
		releaseMany: `DELETE FROM ` + t + ` AS l
WHERE l.name = ANY($1::text[])
    AND CASE WHEN l.token = ($2::text[])[array_position($1::text[], l.name)]
            AND ($3::int8[])[array_position($1::text[], l.name)] IN (0, l.version)
        THEN pg_advisory_xact_lock(` + fenceClass + `, hashtext(l.name)) IS NOT NULL ELSE false END
RETURNING l.name, l.expires_at > clock_timestamp(), ` + notifyIfPresent("$4", "($5::text[])[array_position($1::text[], l.name)]", presenceClass, "l.name"),
		// notifyKey($1 name) returns the notification key's row: its
		// token, NULL when missing.
		notifyKey: `SELECT token FROM ` + t + ` WHERE name = $1`,
		// initNotifyKey($1 name, $2 secret) stores secret as the
		// notification key unless the table has one; expires_at infinity:
		// nobody acquires the row without the secret.
		initNotifyKey: `INSERT INTO ` + t + ` AS l (name, token, owner, version, acquired_at, expires_at)
VALUES ($1, $2, 'sqllock notification key', 1, clock_timestamp(), 'infinity')
ON CONFLICT (name) DO UPDATE SET token = excluded.token, owner = excluded.owner, expires_at = excluded.expires_at
WHERE l.token IS NULL`,
		// inspect($1 key) returns held, owner, version, remaining µs; no
		// row when the key was never locked.
		inspect: `SELECT token IS NOT NULL AND expires_at > clock_timestamp(), coalesce(owner, ''), version, ` + remainingSQL + `
FROM ` + t + ` WHERE name = $1`,
		// list($1 LIKE pattern) returns name, owner, version, remaining µs
		// of every held lock whose name matches, by the name's bytes; not
		// the notification key's row, which looks held forever.
		list: `SELECT name, coalesce(owner, ''), version, ` + remainingSQL + `
FROM ` + t + `
WHERE name LIKE $1 AND name <> '` + notifyKeyName + `' AND token IS NOT NULL AND expires_at > clock_timestamp()
ORDER BY name COLLATE "C"`,
		// breakLock($1 key, $2 fence, $3 channel) deletes the key's row
		// held under fence, notifies as release does, and returns its owner
		// and remaining µs; no row otherwise. Under the name's exclusive
		// fence lock, as release: an acquisition that drew its fence before
		// finds the row and fails, so the next fence is above the removed.
		breakLock: `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fenceClass + `, hashtext($1))),
freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND version = $2 AND name <> '` + notifyKeyName + `' AND token IS NOT NULL
        AND expires_at > clock_timestamp() AND (SELECT true FROM g)
    RETURNING name, coalesce(owner, '') AS owner, ` + remainingSQL + ` AS us
), ` + notifyKeyCTE(t) + `
SELECT freed.owner, freed.us FROM freed LEFT JOIN k ON true, pg_notify($3, ` + payloadSQL("freed.name") + `)`,
		// presenceLock and presenceUnlock($1 class, $2 key) take and drop
		// a key's presence lock for the session, shared.
		presenceLock:   `SELECT pg_advisory_lock_shared($1::int4, hashtext($2))`,
		presenceUnlock: `SELECT pg_advisory_unlock_shared($1::int4, hashtext($2))`,
		// floorInsert and floorDelete($1 key, $2 token): rawFloor's pair.
		floorInsert: `INSERT INTO ` + t + ` (name, token, acquired_at, expires_at) VALUES ($1, $2, now(), now() + interval '30 seconds') ON CONFLICT DO NOTHING`,
		floorDelete: `DELETE FROM ` + t + ` WHERE name = $1 AND token = $2`,
	}
	if schema != "" {
		d.createSchema = `CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{schema}.Sanitize()
	}
	return d
}

// remainingSQL is a row's time left, in whole microseconds by the
// server's clock, zero once expired.
const remainingSQL = `greatest(0, floor(extract(epoch FROM expires_at - clock_timestamp()) * 1000000))::int8`

// likePrefix is the LIKE pattern (default escape '\') of the names that
// start with prefix.
func likePrefix(prefix string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix) + "%"
}

// notifyKeyName is the row that keeps the table's notification key, in
// its token. Every lock key has a '/' (namespace/name), this name has none.
// It keeps the former package name (see newStatements).
const notifyKeyName = "sqllock:notify-key"

// notifyKeyCTE is a WITH item k(k) holding the notification key's bytes,
// for payloadSQL; no row when the table has none.
func notifyKeyCTE(t string) string {
	return `k AS (SELECT convert_to(token, 'UTF8') AS k FROM ` + t + ` WHERE name = '` + notifyKeyName + `')`
}

// notifyIfPresent is an expression, true, that notifies channel with
// payload unless it can take the presence lock of the key in expression
// name exclusively (someone waits for it), which it then holds until the
// release commits (listen.go). The payload comes from the driver, so
// that the statement does not read the notification key's row.
func notifyIfPresent(channel, payload, class, name string) string {
	return `CASE WHEN pg_try_advisory_xact_lock(` + class + `, hashtext(` + name + `)) THEN true
    ELSE pg_notify(` + channel + `, ` + payload + `) IS NOT NULL END`
}

// payloadSQL is the notification payload of the key in expression name, in
// SQL (see notifyPayload); NULL, sent as an empty payload, without a key.
func payloadSQL(name string) string {
	return `encode(sha256(k.k || sha256(k.k || convert_to(` + name + `, 'UTF8'))), 'hex')`
}

// notifyPayload is the payload that announces the release of key:
// hex(H(k || H(k || key))) with SHA-256 and k the table's notification key,
// so that a listener that cannot read the table learns no lock name.
func notifyPayload(secret, key string) string {
	var buf [160]byte // on the stack: a release's only allocation here is the result
	inner := sha256.Sum256(append(append(buf[:0], secret...), key...))
	outer := sha256.Sum256(append(append(buf[:0], secret...), inner[:]...))
	return hex.EncodeToString(outer[:])
}

// MigrationSQL upgrades a table made by an older version of the package
// (before fences came from a sequence), with its default name: run it as
// the table's owner, after every process of the older version stopped.
// The sequence starts above every fence given so far, and the rows of
// released locks, which the older version kept, go. A driver with
// create_table on runs it itself on first use, as it creates the table.
const MigrationSQL = `ALTER TABLE locker_locks ALTER COLUMN version ADD GENERATED BY DEFAULT AS IDENTITY;
SELECT setval(pg_get_serial_sequence('locker_locks', 'version'), greatest(max(version), 1)) FROM locker_locks;
DELETE FROM locker_locks WHERE token IS NULL;`

// migrationFor is MigrationSQL for the quoted table name t.
func migrationFor(t string) string {
	lit := "'" + strings.ReplaceAll(t, "'", "''") + "'"
	return strings.NewReplacer("'"+defaultTable+"'", lit, defaultTable, t).Replace(MigrationSQL)
}

// classOf is the first key of the table's advisory locks of a kind: fence
// (which order an acquisition's fence after the deletion of its last
// holder's row), presence, semaphore or rwlock; the second is hashtext(key).
// Two keys, so that they never meet the one-bigint locks of applications.
func classOf(kind, qualified string) int32 {
	h := fnv.New32a()
	h.Write([]byte("sqllock " + kind + " " + qualified))
	return int32(h.Sum32())
}

// schemaFor returns SchemaSQL for the quoted table name t, without its
// comments, so that a name can only ever be a name.
func schemaFor(t string) string {
	return strings.ReplaceAll(stripComments(SchemaSQL), defaultTable, t)
}

// stripComments drops the SQL comments and blank lines of a schema file.
func stripComments(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if code, _, _ := strings.Cut(line, "--"); strings.TrimSpace(code) != "" {
			b.WriteString(strings.TrimRight(code, " \t\r\n"))
			b.WriteString("\n")
		}
	}
	return strings.TrimSpace(b.String())
}

// createLockKey is the advisory lock that serializes the creation of one
// table between processes. Its seed keeps the former package name (see
// newStatements), so that it is the same lock in processes of either name.
func (d statements) createLockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("github.com/lockerhq/locker/sqllock schema " + d.table))
	return int64(h.Sum64())
}

// PostgreSQL error codes (SQLSTATE) that the driver handles.
const (
	codeSerialization = "40001" // serialization_failure
	codeDivByZero     = "22012" // division_by_zero: acquireMany found a key held
	codeDeadlock      = "40P01" // deadlock_detected
	codeUnique        = "23505" // unique_violation (concurrent CREATE ... IF NOT EXISTS, or a first INSERT race)
	codeDupTable      = "42P07" // duplicate_table
	codeDupSchema     = "42P06" // duplicate_schema
	codeUndefTable    = "42P01" // undefined_table
	codeNoStatement   = "26000" // invalid_sql_statement_name: a prepared statement the server does not have
	codeChangedResult = "0A000" // feature_not_supported: "cached plan must not change result type"
)

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// conflict reports an error that a concurrent transaction caused and that
// goes away when the statement runs again.
func conflict(err error) bool {
	switch sqlState(err) {
	case codeSerialization, codeDeadlock, codeUnique:
		return true
	}
	return false
}

// createRace reports the errors a concurrent CREATE ... IF NOT EXISTS can
// still raise: the other creator won.
func createRace(err error) bool {
	switch sqlState(err) {
	case codeUnique, codeDupTable, codeDupSchema:
		return true
	}
	return false
}

// connLost reports an error from a connection that broke (the server
// terminated the backend, the network failed), after which a new connection
// may well succeed.
func connLost(err error) bool {
	if err == nil {
		return false
	}
	if code := sqlState(err); code != "" {
		return strings.HasPrefix(code, "08") || // connection_exception
			code == "57P01" || code == "57P02" || code == "57P03" // admin/crash shutdown, cannot connect now
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && !pgconn.Timeout(err) {
		return true // a network error that is not our context's deadline
	}
	msg := err.Error()
	return strings.Contains(msg, "unexpected EOF") || strings.Contains(msg, "conn closed") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")
}
