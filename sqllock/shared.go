package sqllock

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/lim"
	"github.com/lockerhq/locker/sqllock/internal/micros"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// SharedSchemaSQL is the DDL of the table of semaphores and read-write
// locks with its default name, locker_locks_shared: the contents of
// shared.sql, for migrations.
//
//go:embed shared.sql
var SharedSchemaSQL string

// defaultShared is the table name in SharedSchemaSQL.
const defaultShared = defaultTable + "_shared"

// The kind column of the shared table: a holder's mode, a waiting
// writer's record, or a resized semaphore's limit (see resize.go).
const (
	kindPermit  = 1
	kindRead    = 2
	kindWrite   = 3
	kindWaiting = 4
	kindLimit   = objects.KindLimit
)

// Modes implements backend.Modal: semaphores and read-write locks, in a
// table of their own beside the lock table.
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher: a holder's permits are in its lim
// (see package lim).
func (d *Driver) Weighs() bool { return true }

// SharedTableName returns the quoted, possibly schema-qualified, name of
// the table of semaphores and read-write locks: the lock table's name
// followed by _shared (a hash of it when that would be too long).
func (d *Driver) SharedTableName() string { return d.shared.table }

// sharedStatements are the shared table's statements, documented where
// newSharedStatements makes them (conventions: see statements).
type sharedStatements struct {
	table  string // quoted, possibly schema-qualified
	create string // its DDL
	// semClass and rwClass are the first keys of the per-object advisory
	// locks of semaphores and read-write locks; the second is hashtext(key).
	semClass, rwClass int32

	lock, grantPermit, dropExpired, grantRead, grantWrite, refresh, release string

	inspect, list, breakHolder string // the operator's (inspect.go)

	resize, unresize string // the limit's record (resize.go)
}

// holderColumns are a holder's row as the operator's statements return
// it: name, kind, owner, version, lim and remaining µs.
const holderColumns = `name, kind, coalesce(owner, ''), version, lim, ` + remainingSQL

// sharedIdent names the shared table of the lock table: table + "_shared",
// or a hash of table when that is longer than PostgreSQL keeps.
func sharedIdent(table string) string { return fit(table+"_shared", "locker_shared_", table) }

func newSharedStatements(schema, table string) sharedStatements {
	t, qualified := quoteIn(schema, sharedIdent(table), table)
	// A grant's shape: the server's now, read once; other tokens' expired
	// rows deleted (the upsert takes the token's own again; a permit's
	// grant leaves them to dropExpired); the live ones counted; the upsert.
	// rc: under READ COMMITTED the statement's snapshot, taken after the
	// object lock, sees every grant made before; under another isolation
	// it may predate the lock, and the statement changes nothing (grant).
	clk := `clk AS MATERIALIZED (SELECT clock_timestamp() AS t, current_setting('transaction_isolation') = 'read committed' AS rc)`
	gone := func(kinds string) string {
		return `gone AS (DELETE FROM ` + t + ` WHERE name = $1 AND kind IN (` + kinds + `) AND token <> $2 AND expires_at <= (SELECT t FROM clk) AND (SELECT rc FROM clk))`
	}
	insert := func(kind, cond, conflict string) string {
		return `INSERT INTO ` + t + ` AS s (name, token, kind, owner, lim, acquired_at, expires_at)
    SELECT $1, $2, ` + kind + `, nullif($3, ''), 0, clk.t, clk.t + $4::int8 * interval '1 microsecond'
    FROM busy, clk WHERE clk.rc AND ` + cond + `
    ON CONFLICT (name, token) DO UPDATE ` + conflict
	}
	// A grant takes the row anew: a new fence, drawn under the object lock.
	step := strconv.Itoa(lim.Step)
	presence := strconv.Itoa(int(classOf("presence", qualified)))
	// record is the row of a resized semaphore's limit (resize.go).
	record := `name = $1 AND token = '` + objects.RecordToken + `' AND kind = ` + strconv.Itoa(kindLimit)
	regrant := func(kind string) string {
		return `SET kind = ` + kind + `, owner = excluded.owner, lim = excluded.lim, version = DEFAULT,
        acquired_at = excluded.acquired_at, expires_at = excluded.expires_at`
	}
	return sharedStatements{
		table:    t,
		create:   strings.ReplaceAll(stripComments(SharedSchemaSQL), defaultShared, t),
		semClass: classOf("semaphore", qualified),
		rwClass:  classOf("rwlock", qualified),
		// lock($1 class, $2 key) takes the object's lock for the
		// transaction, and leaves the grant after it only a plain index
		// scan of the object's rows: the bitmap scan the planner prefers
		// never marks released rows' index entries dead, so every grant
		// read them all until a vacuum (a busy semaphore's permit cost
		// twice a lock).
		lock: `SELECT pg_advisory_xact_lock($1::int4, hashtext($2)),
    set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`,
		// grantPermit($1 key, $2 token, $3 owner, $4 ttl µs, $5 limit, $6
		// weight) returns the new version (NULL when refused), rc, and from
		// one scan the other live holders' permits and lowest and highest
		// limit (lim packs both: package lim), the expired ones' count
		// (dropExpired deletes them: a second data-modifying part here cost
		// every grant), and the record's limit, 0 for none: with a record,
		// it is the limit whatever $5 (Resize gave the holders its limit).
		// now() is the transaction's start, before the scan: a permit counts
		// as expired only if it was then, and the new one's expiry is no
		// later than the TTL from the request.
		grantPermit: `WITH busy AS MATERIALIZED (
    SELECT coalesce(sum(lim / ` + step + ` + 1) FILTER (WHERE expires_at > now()), 0) AS n,
        coalesce(min(lim % ` + step + `) FILTER (WHERE expires_at > now()), 0) AS lo,
        coalesce(max(lim % ` + step + `) FILTER (WHERE expires_at > now()), 0) AS hi,
        count(*) FILTER (WHERE expires_at <= now()) AS x,
        current_setting('transaction_isolation') = 'read committed' AS rc,
        (SELECT r.lim FROM ` + t + ` AS r WHERE r.` + strings.ReplaceAll(record, " AND ", " AND r.") + `) AS r
    FROM ` + t + `
    WHERE name = $1 AND kind = 1 AND token <> $2
), got AS (
    INSERT INTO ` + t + ` AS s (name, token, kind, owner, lim, acquired_at, expires_at)
    SELECT $1, $2, 1, nullif($3, ''), coalesce(busy.r, $5::int4) + ($6::int4 - 1) * ` + step + `, now(), now() + $4::int8 * interval '1 microsecond'
    FROM busy WHERE busy.rc AND busy.n + $6::int4 <= coalesce(busy.r, $5::int4)
        AND (busy.r IS NOT NULL OR busy.n = 0 OR busy.lo = $5::int4 AND busy.hi = $5::int4)
    ON CONFLICT (name, token) DO UPDATE ` + regrant("1") + `
    WHERE s.kind = 1
    RETURNING version
)
SELECT (SELECT version FROM got), busy.rc, busy.n, busy.lo, busy.hi, busy.x, coalesce(busy.r, 0) FROM busy`,
		// dropExpired($1 key) deletes the semaphore's expired permits,
		// without the object lock: expired rows hold nothing (grants count
		// live ones, a refresh extends only a live row), and one taken
		// again meanwhile is live when the deletion reads it again.
		dropExpired: `DELETE FROM ` + t + ` WHERE name = $1 AND kind = 1 AND expires_at <= clock_timestamp()`,
		// grantRead and grantWrite($1 key, $2 token, $3 owner, $4 ttl µs)
		// return the new version (NULL when refused) and rc. A live writer,
		// or another token's waiting record, keeps readers out.
		grantRead: `WITH ` + clk + `, ` + gone("2, 3, 4") + `,
busy AS MATERIALIZED (
    SELECT count(*) AS n FROM ` + t + `
    WHERE name = $1 AND kind IN (3, 4) AND token <> $2 AND expires_at > (SELECT t FROM clk)
), got AS (
    ` + insert("2", "busy.n = 0", regrant("2")+`
    WHERE s.kind = 2`) + `
    RETURNING version
)
SELECT (SELECT version FROM got), (SELECT rc FROM clk)`,
		// The grant turns the writer's own waiting record into its hold;
		// a refusal records it as the waiting writer unless another
		// token's record lives, or renews its own.
		grantWrite: `WITH ` + clk + `, ` + gone("2, 3, 4") + `,
busy AS MATERIALIZED (
    SELECT count(*) FILTER (WHERE kind IN (2, 3)) AS holders, count(*) FILTER (WHERE kind = 4) AS waiting
    FROM ` + t + `
    WHERE name = $1 AND kind IN (2, 3, 4) AND token <> $2 AND expires_at > (SELECT t FROM clk)
), got AS (
    ` + insert("3", "busy.holders = 0", regrant("3")+`
    WHERE s.kind IN (3, 4)`) + `
    RETURNING version
), wait AS (
    ` + insert("4", "busy.holders > 0 AND busy.waiting = 0", `SET expires_at = excluded.expires_at
    WHERE s.kind = 4`) + `
)
SELECT (SELECT version FROM got), (SELECT rc FROM clk)`,
		// refresh($1 keys, $2 tokens, $3 fences, $4 ttls µs, $5 owners, $6
		// kinds, $7 classes) extends each live holder and returns the
		// 1-based positions of those it extended. Under the object locks,
		// shared: a grant that counted a holder as expired commits before
		// the holder's refresh looks at its row, which it then finds gone.
		refresh: `WITH b AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::int2[], $7::int4[])
        WITH ORDINALITY AS b(name, token, fence, us, owner, kind, class, i)
), g AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock_shared(o.class, hashtext(o.name))) AS n
    FROM (SELECT DISTINCT class, name FROM b ORDER BY class, name) AS o
)
UPDATE ` + t + ` AS s
SET expires_at = clock_timestamp() + b.us * interval '1 microsecond'
FROM b
WHERE s.name = b.name AND s.token = b.token AND s.kind = b.kind AND (b.fence = 0 OR s.version = b.fence)
    AND s.expires_at > clock_timestamp() AND s.owner IS NOT DISTINCT FROM nullif(b.owner, '')
    AND (SELECT g.n >= 0 FROM g)
RETURNING b.i`,
		// release($1 key, $2 token, $3 kinds, $4 fence or 0, $5 channel, $6
		// the key's notifyPayload) deletes the token's row (a holder's or a
		// waiting writer's), notifies as a lock's release does, and returns
		// its kind, whether it was live, and true; no row without one. No
		// object lock: a grant would have counted the row as held anyway.
		release: `DELETE FROM ` + t + `
WHERE name = $1 AND token = $2 AND kind = ANY($3::int2[]) AND ($4::int8 = 0 OR kind = 4 OR version = $4)
RETURNING kind, expires_at > clock_timestamp(), ` + notifyIfPresent("$5", "$6", presence, "name"),
		// inspect($1 key, $2 kinds) returns the holderColumns of the
		// object's live holders (its rows of kinds) by version, and a
		// semaphore's limit record (kinds with 1); list($1 LIKE pattern, $2
		// kinds) those of every matching object, by name's bytes, version.
		inspect: `SELECT ` + holderColumns + ` FROM ` + t + `
WHERE name = $1 AND kind = ANY($2::int2[]) AND expires_at > clock_timestamp()
UNION ALL SELECT name, kind, '', version, lim, 0 FROM ` + t + ` WHERE ` + record + ` AND 1 = ANY($2::int2[])
ORDER BY version`,
		list: `SELECT ` + holderColumns + ` FROM ` + t + `
WHERE name LIKE $1 AND kind = ANY($2::int2[]) AND expires_at > clock_timestamp() ORDER BY name COLLATE "C", version`,
		// breakHolder($1 key, $2 kinds, $3 fence, $4 channel, $5 the
		// key's notifyPayload) deletes the object's live holder of fence (a
		// row of kinds; one taken again has another fence), notifies as
		// release does, and returns its holderColumns and true; no row
		// without one.
		breakHolder: `DELETE FROM ` + t + `
WHERE name = $1 AND kind = ANY($2::int2[]) AND version = $3 AND expires_at > clock_timestamp()
RETURNING ` + holderColumns + `, ` + notifyIfPresent("$4", "$5", presence, "name"),
		// resize($1 key, $2 limit, $3 channel, $4 the key's notifyPayload),
		// under the semaphore's lock, writes its record (never expiring),
		// gives its holders the limit, by which the mismatch rule judges
		// claims once the record is gone, and notifies as a release does:
		// a raised limit lets waiters in.
		resize: `WITH rec AS (
    INSERT INTO ` + t + ` AS s (name, token, kind, owner, lim, acquired_at, expires_at)
    VALUES ($1, '` + objects.RecordToken + `', ` + strconv.Itoa(kindLimit) + `, NULL, $2::int4, clock_timestamp(), 'infinity')
    ON CONFLICT (name, token) DO UPDATE SET lim = excluded.lim, acquired_at = excluded.acquired_at
    WHERE s.kind = ` + strconv.Itoa(kindLimit) + `
), held AS (
    UPDATE ` + t + ` SET lim = $2::int4 + lim / ` + step + ` * ` + step + ` WHERE name = $1 AND kind = 1
)
SELECT ` + notifyIfPresent("$3", "$4", presence, "$1::text"),
		// unresize($1 key) deletes the record; the holders keep its limit.
		unresize: `DELETE FROM ` + t + ` WHERE ` + record,
	}
}

// sharedKinds returns the row kind of a claim's hold, the kinds its
// release deletes and its object's lock class; bad input is an error
// before any statement.
func (d *Driver) sharedKinds(c backend.Claim) (int16, []int16, int32, error) {
	switch c.Mode {
	case backend.Permit:
		if _, err := lim.Of("sqllock: ", c); err != nil {
			return 0, nil, 0, err
		}
		return kindPermit, []int16{kindPermit}, d.shared.semClass, nil
	case backend.Read:
		return kindRead, []int16{kindRead}, d.shared.rwClass, nil
	case backend.Write:
		// Release withdraws a waiting writer's record too.
		return kindWrite, []int16{kindWrite, kindWaiting}, d.shared.rwClass, nil
	}
	return 0, nil, 0, fmt.Errorf("sqllock: %w: mode %v", backend.ErrUnsupported, c.Mode)
}

// ensureShared makes the shared table on first use of a semaphore or a
// read-write lock (locks alone never need it), as ensureSchema does the
// lock table; with create_table=false it checks that the table exists.
func (d *Driver) ensureShared(ctx context.Context) error {
	if err := d.ensureSchema(ctx); err != nil {
		return err
	}
	return d.once(ctx, &d.sharedOK, func(ctx context.Context) error {
		return d.createIfMissing(ctx, d.shared.table, "shared.sql", func(ctx context.Context) error {
			return d.createLocked(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, d.shared.create)
				return err
			})
		})
	})
}

// grant runs a grant statement after the object's lock in one round trip:
// a pipeline, one implicit transaction, so that the lock is held until the
// grant commits. Under READ COMMITTED the grant's snapshot, taken with the
// lock held, counts every holder granted before. Under a session default
// of another isolation, the snapshot may predate the lock: the statement
// then changes nothing, and grant runs it again in an explicit READ
// COMMITTED transaction, as the driver does from then on. dest's first two
// are the version and rc.
func (d *Driver) grant(ctx context.Context, class int32, key, stmt string, args []any, dest ...any) error {
	explicit := d.explicitGrant.Load()
	err := d.grantBatch(ctx, explicit, class, key, stmt, args, dest...)
	if err != nil || explicit || *dest[1].(*bool) {
		return err
	}
	d.explicitGrant.Store(true)
	return d.grantBatch(ctx, true, class, key, stmt, args, dest...)
}

// grantBatch sends the lock and the grant, in an explicit transaction if
// explicit (a failure then leaves it aborted, and the pool drops that
// connection).
func (d *Driver) grantBatch(ctx context.Context, explicit bool, class int32, key, stmt string, args []any, dest ...any) error {
	b := &pgx.Batch{}
	if explicit {
		b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	}
	b.Queue(d.shared.lock, class, key)
	b.Queue(stmt, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	if explicit {
		b.Queue("COMMIT")
	}
	// Close reads every result in order, and returns the first error.
	return d.pool.SendBatch(ctx, b).Close()
}

// tryShared is TryAcquire for a permit, a reader or a writer: one grant
// transaction under the object's lock. A refused writer records itself as
// waiting; the locker package withdraws the record when it stops trying.
func (d *Driver) tryShared(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	_, _, class, err := d.sharedKinds(l)
	if err != nil {
		return backend.Grant{}, err
	}
	us, err := micros.Of("sqllock: ", l.TTL)
	if err != nil {
		return backend.Grant{}, err
	}
	ctx, leave, err := d.begin(ctx, "acquire", true)
	if err != nil {
		return backend.Grant{}, err
	}
	defer leave()
	var (
		version   *int64
		rc        bool
		n, lo, hi int64
		expired   int64
		resized   int32
		stmt      string
		args      = []any{l.Key, l.Token, l.Owner, us}
		dest      = []any{&version, &rc}
	)
	switch l.Mode {
	case backend.Permit:
		stmt, args, dest = d.shared.grantPermit, append(args, int32(l.Limit), int32(max(l.Weight, 1))), append(dest, &n, &lo, &hi, &expired, &resized)
	case backend.Read:
		stmt = d.shared.grantRead
	default:
		stmt = d.shared.grantWrite
	}
	// Idempotent for one token, as the lock's acquire: the token's own
	// row is taken again.
	err = d.retry(ctx, func() error { return d.grant(ctx, class, l.Key, stmt, args, dest...) })
	if err == nil && expired > 0 {
		// Housekeeping: a failure leaves them to the next grant.
		_, _ = d.pool.Exec(ctx, d.shared.dropExpired, l.Key)
	}
	switch {
	case err != nil:
		return backend.Grant{}, d.acquireFailed(err, func(ctx context.Context) {
			_, _ = d.pool.Exec(ctx, d.shared.release, l.Key, l.Token, []int16{kindPermit, kindRead, kindWrite, kindWaiting}, 0, d.sql.channel, d.payload(l.Key))
		})
	case version != nil:
		return backend.Grant{Fence: uint64(*version), TTL: time.Duration(us) * time.Microsecond}, nil
	case resized > 0 && max(l.Weight, 1) > int(resized):
		return backend.Grant{}, fmt.Errorf("sqllock: %w", backend.ResizedTo(max(l.Weight, 1), resized))
	case resized == 0 && n > 0 && (lo != int64(l.Limit) || hi != int64(l.Limit)):
		held := strconv.FormatInt(lo, 10)
		if hi != lo {
			held += " to " + strconv.FormatInt(hi, 10)
		}
		return backend.Grant{}, fmt.Errorf("sqllock: %w", backend.HeldUnder(held, l.Limit))
	}
	return backend.Grant{}, fmt.Errorf("sqllock: %w", backend.ErrNotAcquired)
}
