package sqllock

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/internal/bench"
)

// BenchmarkStatementParts times variants of the acquire and release
// statements on one connection, op by op in rotating order, against the
// raw floor's pair: what each part of the statements costs the server
// ("full": the statements before the notification payload came from the
// driver; "new": the driver's own).
//
//	SQLLOCK_STMTCOST=1 go test -run '^$' -bench StatementParts -benchtime 3000x ./sqllock
func BenchmarkStatementParts(b *testing.B) {
	if os.Getenv("SQLLOCK_STMTCOST") == "" {
		b.Skip("SQLLOCK_STMTCOST not set")
	}
	admin := adminPool(b)
	pool, d := benchPool(b, admin)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	t := d.sql.table
	fc := strconv.Itoa(int(d.sql.fenceClass))
	pc := strconv.Itoa(int(d.sql.presenceClass))
	us := int64(30 * time.Second / time.Microsecond)
	key := "bench/parts"
	payload := notifyPayload(d.notifySecret, key)

	oldNotify := `n AS (SELECT pg_notify($4, ` + payloadSQL("freed.name") + `) FROM freed LEFT JOIN k ON true
    WHERE NOT pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name)))`
	acqLock := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(` + fc + `, hashtext($1)))
INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT $1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond' FROM g
ON CONFLICT (name) DO UPDATE
SET token = excluded.token, owner = excluded.owner, version = DEFAULT,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.token IS NULL OR l.expires_at <= clock_timestamp() OR l.token = excluded.token
RETURNING version`
	acqNoLock := `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
VALUES ($1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE
SET token = excluded.token, owner = excluded.owner, version = DEFAULT,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.token IS NULL OR l.expires_at <= clock_timestamp() OR l.token = excluded.token
RETURNING version`
	acqBare := `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
VALUES ($1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond')
ON CONFLICT DO NOTHING RETURNING version`
	// The release as it was before the payload came from the driver.
	relFull := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fc + `, hashtext($1))),
freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND (SELECT true FROM g)
    RETURNING name, expires_at > clock_timestamp() AS live
), ` + notifyKeyCTE(t) + `, ` + oldNotify + `
SELECT freed.live, true FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relNoNotify := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fc + `, hashtext($1)))
DELETE FROM ` + t + ` WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND (SELECT true FROM g)
RETURNING expires_at > clock_timestamp() AS live, true`
	relNoLock := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3)
    RETURNING name, expires_at > clock_timestamp() AS live
), ` + notifyKeyCTE(t) + `, ` + oldNotify + `
SELECT freed.live, true FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relBare := `DELETE FROM ` + t + ` WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) RETURNING expires_at > clock_timestamp(), true`
	relTry := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3)
    RETURNING name, expires_at > clock_timestamp() AS live
)
SELECT freed.live, true FROM freed WHERE pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name))`

	relPayload := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fc + `, hashtext($1))),
freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND (SELECT true FROM g)
    RETURNING name, expires_at > clock_timestamp() AS live
), n AS (SELECT pg_notify($4, $5) FROM freed WHERE NOT pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name)))
SELECT freed.live, true FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relPayloadFlat := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND pg_advisory_xact_lock(` + fc + `, hashtext($1)) IS NOT NULL
    RETURNING name, expires_at > clock_timestamp() AS live
)
SELECT freed.live, true FROM freed WHERE pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name)) OR pg_notify($4, $5) IS NOT NULL`
	acqSub := `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT $1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond' FROM (SELECT pg_advisory_xact_lock_shared(` + fc + `, hashtext($1))) g
ON CONFLICT (name) DO UPDATE
SET token = excluded.token, owner = excluded.owner, version = DEFAULT,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.token IS NULL OR l.expires_at <= clock_timestamp() OR l.token = excluded.token
RETURNING version`
	acqNow := strings.ReplaceAll(acqLock, "clock_timestamp()", "now()")
	acqNothing := `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT $1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond'
WHERE pg_advisory_xact_lock_shared(` + fc + `, hashtext($1)) IS NOT NULL
ON CONFLICT (name) DO NOTHING
RETURNING version`
	type variant struct {
		name     string
		acq, rel string
		relArgs  int // 3 or 4 arguments
	}
	vs := []variant{
		{"floor", d.sql.floorInsert, d.sql.floorDelete, 2},
		{"full", acqLock, relFull, 4},
		{"acqNoLock", acqNoLock, relFull, 4},
		{"relNoNotify", acqLock, relNoNotify, 3},
		{"relNoLock", acqLock, relNoLock, 4},
		{"bothNoLock+noNotify", acqNoLock, relBare, 3},
		{"bare", acqBare, relBare, 3},
		{"relTryOnly", acqLock, relTry, 3},
		{"payload", acqLock, relPayload, 5},
		{"payloadFlat", acqLock, relPayloadFlat, 5},
		{"payloadFlat+acqSub", acqSub, relPayloadFlat, 5},
		{"payload+acqNow", acqNow, relPayload, 5},
		{"new", d.sql.acquire, d.sql.release, 5},
		{"acqNothing", acqNothing, d.sql.release, 5},
	}
	if only := os.Getenv("SQLLOCK_STMTCOST_ONLY"); only != "" {
		var keep []variant
		for _, v := range vs {
			if v.name == "floor" || strings.Contains(","+only+",", ","+v.name+",") {
				keep = append(keep, v)
			}
		}
		vs = keep
	}
	run := func(v variant) {
		token := randHex(16)
		if v.relArgs == 2 {
			if _, err := conn.Exec(ctx, v.acq, key+"f", token); err != nil {
				b.Fatal(err)
			}
			if _, err := conn.Exec(ctx, v.rel, key+"f", token); err != nil {
				b.Fatal(err)
			}
			return
		}
		var version int64
		if err := conn.QueryRow(ctx, v.acq, key, token, "", us).Scan(&version); err != nil {
			b.Fatal(v.name, err)
		}
		args := []any{key, token, version}
		if v.relArgs >= 4 {
			args = append(args, d.sql.channel)
		}
		if v.relArgs == 5 {
			args = append(args, payload)
		}
		var live bool
		if err := conn.QueryRow(ctx, v.rel, args...).Scan(&live, nil); err != nil {
			b.Fatal(v.name, err)
		}
	}
	for _, v := range vs {
		for range 50 {
			run(v)
		}
	}
	samples := make([][]time.Duration, len(vs))
	for i := 0; b.Loop(); i++ {
		for j := range vs {
			k := (i + j) % len(vs)
			start := time.Now()
			run(vs[k])
			samples[k] = append(samples[k], time.Since(start))
		}
	}
	floor := bench.Percentile(samples[0], 0.5)
	for k, v := range vs {
		med := bench.Percentile(samples[k], 0.5)
		b.ReportMetric(float64(med.Microseconds()), v.name+"-µs")
		if k > 0 {
			b.ReportMetric(float64(med)/float64(floor), v.name+"/floor")
		}
	}
}

// BenchmarkPermitParts times a permit's grant and release on one
// connection, op by op in rotating order, against a lock's pair: the
// grant as the driver sends it (the object lock and the grant statement
// in one pipeline), and its parts.
//
//	SQLLOCK_STMTCOST=1 go test -run '^$' -bench PermitParts -benchtime 3000x ./sqllock
func BenchmarkPermitParts(b *testing.B) {
	if os.Getenv("SQLLOCK_STMTCOST") == "" {
		b.Skip("SQLLOCK_STMTCOST not set")
	}
	admin := adminPool(b)
	pool, d := benchPool(b, admin)
	ctx := context.Background()
	if err := d.ensureShared(ctx); err != nil {
		b.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	us := int64(30 * time.Second / time.Microsecond)
	lockKey, semKey := "bench/lock", "bench/sem"
	lockPayload, semPayload := notifyPayload(d.notifySecret, lockKey), notifyPayload(d.notifySecret, semKey)
	kinds := []int16{kindPermit}
	lock := func() {
		token := randHex(16)
		var version int64
		if err := conn.QueryRow(ctx, d.sql.acquire, lockKey, token, "", us).Scan(&version); err != nil {
			b.Fatal(err)
		}
		var live bool
		if err := conn.QueryRow(ctx, d.sql.release, lockKey, token, version, d.sql.channel, lockPayload).Scan(&live, nil); err != nil {
			b.Fatal(err)
		}
	}
	release := func(token string, version int64) {
		var kind int16
		var live bool
		if err := conn.QueryRow(ctx, d.shared.release, semKey, token, kinds, version, d.sql.channel, semPayload).Scan(&kind, &live, nil); err != nil {
			b.Fatal(err)
		}
	}
	grantArgs := func(token string) []any { return []any{semKey, token, "", us, int32(4)} }
	// batchWith: the object lock and grant, a grant statement, pipelined.
	batchWith := func(grant string) func() {
		return func() {
			token := randHex(16)
			bt := &pgx.Batch{}
			bt.Queue(d.shared.lock, d.shared.semClass, semKey)
			bt.Queue(grant, grantArgs(token)...)
			br := conn.SendBatch(ctx, bt)
			if _, err := br.Exec(); err != nil {
				b.Fatal(err)
			}
			var version *int64
			var rc bool
			var n, lo, hi int64
			if err := br.QueryRow().Scan(&version, &rc, &n, &lo, &hi); err != nil || version == nil {
				b.Fatal(err, version)
			}
			if err := br.Close(); err != nil {
				b.Fatal(err)
			}
			release(token, *version)
		}
	}
	batch := batchWith(d.shared.grantPermit)
	alone := func() { // unsafe: no object lock, for its cost only
		token := randHex(16)
		var version *int64
		var rc bool
		var n, lo, hi int64
		if err := conn.QueryRow(ctx, d.shared.grantPermit, grantArgs(token)...).Scan(&version, &rc, &n, &lo, &hi); err != nil || version == nil {
			b.Fatal(err, version)
		}
		release(token, *version)
	}
	t := d.shared.table
	lean := `WITH busy AS MATERIALIZED (
    SELECT count(*) FILTER (WHERE expires_at > now()) AS n,
        coalesce(min(lim) FILTER (WHERE expires_at > now()), 0) AS lo,
        coalesce(max(lim) FILTER (WHERE expires_at > now()), 0) AS hi,
        count(*) FILTER (WHERE expires_at <= now()) AS x,
        current_setting('transaction_isolation') = 'read committed' AS rc
    FROM ` + t + ` WHERE name = $1 AND kind = 1 AND token <> $2
), got AS (
    INSERT INTO ` + t + ` AS s (name, token, kind, owner, lim, acquired_at, expires_at)
    SELECT $1, $2, 1, nullif($3, ''), $5::int4, now(), now() + $4::int8 * interval '1 microsecond'
    FROM busy WHERE busy.rc AND busy.n < $5::int4 AND (busy.n = 0 OR busy.lo = $5::int4 AND busy.hi = $5::int4)
    ON CONFLICT (name, token) DO UPDATE SET kind = 1, owner = excluded.owner, lim = excluded.lim, version = DEFAULT,
        acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
    WHERE s.kind = 1
    RETURNING version
)
SELECT (SELECT version FROM got), busy.rc, busy.n, busy.lo, busy.hi FROM busy`
	leanBatch := batchWith(lean)
	fs := []func(){lock, batch, alone, leanBatch}
	names := []string{"lock", "permit", "grantAlone", "lean"}
	for _, f := range fs {
		for range 50 {
			f()
		}
	}
	samples := make([][]time.Duration, len(fs))
	for i := 0; b.Loop(); i++ {
		for j := range fs {
			k := (i + j) % len(fs)
			start := time.Now()
			fs[k]()
			samples[k] = append(samples[k], time.Since(start))
		}
	}
	base := bench.Percentile(samples[0], 0.5)
	for k, name := range names {
		med := bench.Percentile(samples[k], 0.5)
		b.ReportMetric(float64(med.Microseconds()), name+"-µs")
		if k > 0 {
			b.ReportMetric(float64(med)/float64(base), name+"/lock")
		}
	}
}
