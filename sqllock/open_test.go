package sqllock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// URLs rejected before any connection is attempted.
func TestOpenRejectsBadURLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := map[string]string{
		"unknown parameter":        "postgres://u:s3cret@127.0.0.1:1/db?lock_tabel=x",
		"a server setting":         "postgres://u:s3cret@127.0.0.1:1/db?default_transaction_isolation=serializable",
		"a custom server setting":  "postgres://u:s3cret@127.0.0.1:1/db?my.setting=1",
		"bad create_table":         "postgres://u:s3cret@127.0.0.1:1/db?create_table=maybe",
		"empty table":              "postgres://u:s3cret@127.0.0.1:1/db?lock_table=",
		"table too long":           "postgres://u:s3cret@127.0.0.1:1/db?lock_table=" + strings.Repeat("t", 64),
		"bad sslmode":              "postgres://u:s3cret@127.0.0.1:1/db?sslmode=sometimes",
		"bad pool_max_conns":       "postgres://u:s3cret@127.0.0.1:1/db?pool_max_conns=many",
		"password in query, typo":  "postgres://u@127.0.0.1:1/db?password=s3cret&sslmod=disable",
		"other scheme":             "mysql://u:s3cret@127.0.0.1:1/db",
		"sslpassword in the query": "postgres://u@127.0.0.1:1/db?sslpassword=s3cret&bogus=1",
	}
	for what, raw := range cases {
		start := time.Now()
		d, err := Open(ctx, raw)
		if err == nil {
			d.Close()
			t.Errorf("%s: Open(%q) succeeded", what, raw)
			continue
		}
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s: Open = %v, want ErrInvalidURL", what, err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", what, err)
		}
		if !strings.HasPrefix(err.Error(), "sqllock: ") {
			t.Errorf("%s: error %q does not start with the package name", what, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: took %v: a bad URL must fail before dialling", what, took)
		}
	}
}

// An unreachable server fails Open quickly, with no password in the error.
func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Open(ctx, "postgres://u:s3cret@127.0.0.1:1/db?sslmode=disable&connect_timeout=2")
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error shows the password: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("Open took %v", took)
	}
}

// Every accepted form opens, through locker.Open and the registry too.
func TestOpenForms(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	base := baseURL(t)
	ctx := context.Background()
	schema := "sqllock_f_" + randHex(4)
	table := testTable(t, admin, schema)
	table2 := testTable(t, admin, "")
	forms := []string{
		withParams(t, base, paramTable, table, paramSchema, schema, "application_name", "sqllock-test",
			"search_path", "public", "statement_timeout", "5000", "connect_timeout", "5", "pool_max_conns", "4",
			"default_query_exec_mode", "cache_describe"),
		strings.Replace(withParams(t, base, paramTable, table2, paramCreate, "true"), "postgres://", "postgresql://", 1),
		// Two hosts, pgx's multi-host form (both the test server here).
		strings.Replace(withParams(t, base, paramTable, table2, "target_session_attrs", "read-write"),
			testenv.PostgresAddr(), testenv.PostgresAddr()+","+testenv.PostgresAddr(), 1),
	}
	for _, raw := range forms {
		c, err := locker.Open(ctx, withParams(t, raw, "namespace", "forms", "ttl", "2s"))
		if err != nil {
			t.Fatalf("locker.Open(%s): %v", raw, err)
		}
		l, err := c.TryAcquire(ctx, "x")
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", raw, err)
		}
		if l.Fence() == 0 || l.TTL() != 2*time.Second {
			t.Fatalf("%s: fence %d ttl %v", raw, l.Fence(), l.TTL())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.Driver().(*Driver); !ok {
			t.Fatalf("driver %T", c.Driver())
		}
		c.Close()
	}
}

// With create_table=false, a missing table is an error that says what to
// do; an existing one (made by "migrations") works.
func TestCreateTableFalse(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	ctx := context.Background()
	table := testTable(t, admin, "")
	u := withParams(t, baseURL(t), paramTable, table, paramCreate, "false")
	if _, err := Open(ctx, u); err == nil || !strings.Contains(err.Error(), "schema.sql") {
		t.Fatalf("Open without the table = %v, want an error naming schema.sql", err)
	}
	// The migration: schema.sql with the table name replaced.
	ddl := strings.ReplaceAll(SchemaSQL, defaultTable, quote(table))
	if _, err := admin.Exec(ctx, ddl); err != nil {
		t.Fatalf("schema.sql: %v", err)
	}
	d, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("Open with the table: %v", err)
	}
	defer d.Close()
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: "k", Token: randHex(16), TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := New(nil); !errors.Is(err, backend.ErrInvalidOption) {
		t.Fatalf("New(nil): %v, want ErrInvalidOption", err)
	}
	for _, o := range []Option{WithTable(""), WithTable(strings.Repeat("x", 64)), WithTable("a\x00b"), WithTable("x\nDROP TABLE y; --"), WithSchema(strings.Repeat("s", 64))} {
		if _, err := newConfig([]Option{o}); !errors.Is(err, backend.ErrInvalidOption) || errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("bad option: %v, want ErrInvalidOption (not ErrInvalidURL)", err)
		}
	}
	if got := newStatements("My Schema", `we"ird`).table; got != `"My Schema"."we""ird"` {
		t.Fatalf("quoted table %s", got)
	}
	if ch := newStatements(strings.Repeat("s", 63), strings.Repeat("t", 63)).channel; len(ch) > maxIdentLen {
		t.Fatalf("channel %q longer than %d bytes", ch, maxIdentLen)
	}
}

// Names that need quoting work end to end: creation, locks, notifications.
func TestQuotedNames(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	ctx := context.Background()
	schema, table := `Sch ema.`+randHex(3), `Locks "Q" ü-`+randHex(3)
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+quote(schema)+" CASCADE")
	})
	d, err := Open(ctx, baseURL(t), WithSchema(schema), WithTable(table))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer d.Close()
	ch, cancel, err := d.Subscribe(ctx, "q/k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	l := backend.Claim{Key: "q/k", Token: randHex(16), TTL: time.Second}
	rows := func() int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+d.TableName()+` WHERE name <> $1`, notifyKeyName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows while held, want 1", n)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no notification")
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d rows after the release, want none", n)
	}
}

// A table made by an older version (version without a sequence) is
// migrated on first use with create_table on: fences go on above the old
// ones, and the rows of released locks go. With create_table=false it is
// an error that names MigrationSQL, until someone runs it.
func TestMigratesOlderTable(t *testing.T) {
	t.Parallel()
	admin := adminPool(t)
	ctx := context.Background()
	for _, create := range []string{"true", "false"} {
		table := testTable(t, admin, "")
		qt := quote(table)
		old := `CREATE TABLE ` + qt + ` (name text PRIMARY KEY, token text, owner text, version bigint NOT NULL,
    acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL);
INSERT INTO ` + qt + ` VALUES ('ns/held', 'tok', NULL, 41, now(), now() + interval '1 hour'),
    ('ns/freed', NULL, NULL, 70, now(), now());`
		if _, err := admin.Exec(ctx, old); err != nil {
			t.Fatal(err)
		}
		u := withParams(t, baseURL(t), paramTable, table, paramCreate, create)
		if create == "false" {
			if _, err := Open(ctx, u); err == nil || !strings.Contains(err.Error(), "MigrationSQL") {
				t.Fatalf("Open on an older table with create_table=false = %v, want an error naming MigrationSQL", err)
			}
			if _, err := admin.Exec(ctx, strings.ReplaceAll(MigrationSQL, defaultTable, qt)); err != nil {
				t.Fatalf("MigrationSQL: %v", err)
			}
		}
		d, err := Open(ctx, u)
		if err != nil {
			t.Fatalf("create_table=%s: Open on an older table: %v", create, err)
		}
		defer d.Close()
		var freed int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+qt+` WHERE name = 'ns/freed'`).Scan(&freed); err != nil || freed != 0 {
			t.Fatalf("create_table=%s: %d rows of a released lock after the migration (%v), want none", create, freed, err)
		}
		for _, key := range []string{"ns/freed", "ns/new"} {
			g, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: randHex(16), TTL: time.Second})
			if err != nil || g.Fence <= 70 {
				t.Fatalf("create_table=%s: TryAcquire %s = %+v, %v, want a fence above the old 70", create, key, g, err)
			}
		}
		if _, err := d.TryAcquire(ctx, backend.Claim{Key: "ns/held", Token: randHex(16), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("create_table=%s: the lock held before the migration: %v, want ErrNotAcquired", create, err)
		}
	}
}
