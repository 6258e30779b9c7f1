package pglock

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/bench"
)

// BenchmarkStatementParts times variants of the acquire and release
// statements on one connection, op by op in rotating order, against the
// raw floor's pair: what each part of the statements costs the server
// ("full": the statements before the notification payload came from the
// driver; "new": the driver's own).
//
//	PGLOCK_STMTCOST=1 go test -run '^$' -bench StatementParts -benchtime 3000x ./pglock
func BenchmarkStatementParts(b *testing.B) {
	if os.Getenv("PGLOCK_STMTCOST") == "" {
		b.Skip("PGLOCK_STMTCOST not set")
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
SELECT freed.live FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relNoNotify := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fc + `, hashtext($1)))
DELETE FROM ` + t + ` WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND (SELECT true FROM g)
RETURNING expires_at > clock_timestamp() AS live`
	relNoLock := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3)
    RETURNING name, expires_at > clock_timestamp() AS live
), ` + notifyKeyCTE(t) + `, ` + oldNotify + `
SELECT freed.live FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relBare := `DELETE FROM ` + t + ` WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) RETURNING expires_at > clock_timestamp()`
	relTry := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3)
    RETURNING name, expires_at > clock_timestamp() AS live
)
SELECT freed.live FROM freed WHERE pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name))`

	relPayload := `WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + fc + `, hashtext($1))),
freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND (SELECT true FROM g)
    RETURNING name, expires_at > clock_timestamp() AS live
), n AS (SELECT pg_notify($4, $5) FROM freed WHERE NOT pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name)))
SELECT freed.live FROM freed WHERE (SELECT count(*) FROM n) >= 0`
	relPayloadFlat := `WITH freed AS (
    DELETE FROM ` + t + `
    WHERE name = $1 AND token = $2 AND ($3::int8 = 0 OR version = $3) AND pg_advisory_xact_lock(` + fc + `, hashtext($1)) IS NOT NULL
    RETURNING name, expires_at > clock_timestamp() AS live
)
SELECT freed.live FROM freed WHERE pg_try_advisory_xact_lock(` + pc + `, hashtext(freed.name)) OR pg_notify($4, $5) IS NOT NULL`
	acqSub := `INSERT INTO ` + t + ` AS l (name, token, owner, acquired_at, expires_at)
SELECT $1, $2, nullif($3, ''), clock_timestamp(), clock_timestamp() + $4::int8 * interval '1 microsecond' FROM (SELECT pg_advisory_xact_lock_shared(` + fc + `, hashtext($1))) g
ON CONFLICT (name) DO UPDATE
SET token = excluded.token, owner = excluded.owner, version = DEFAULT,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.token IS NULL OR l.expires_at <= clock_timestamp() OR l.token = excluded.token
RETURNING version`
	acqNow := strings.ReplaceAll(acqLock, "clock_timestamp()", "now()")
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
	}
	if only := os.Getenv("PGLOCK_STMTCOST_ONLY"); only != "" {
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
		if err := conn.QueryRow(ctx, v.rel, args...).Scan(&live); err != nil {
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
