package sqllock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func diagnoseLevels(t *testing.T, ctx context.Context, url string, opts ...Option) map[string]backend.Level {
	t.Helper()
	d, err := Open(ctx, url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err := d.Diagnose(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]backend.Level{}
	for _, f := range fs {
		got[f.Check] = f.Level
	}
	return got
}

// A server without fsync, and a superuser role, as the test servers run,
// are reported; a durable server, with a role of its own, is sound.
func TestDiagnose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := testenv.StartPostgres(t)
	got := diagnoseLevels(t, ctx, s.URL)
	if got["postgres.durability"] != backend.Unsafe || got["postgres.role"] != backend.Warning || got["postgres.replication"] != backend.Sound {
		t.Fatalf("a server without fsync, as a superuser: %v", got)
	}
	durable := testenv.StartPostgresWith(t, "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on")
	admin, err := pgx.Connect(ctx, durable.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, q := range []string{"CREATE ROLE locker_app LOGIN", "GRANT CREATE ON SCHEMA public TO locker_app"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	got = diagnoseLevels(t, ctx, strings.Replace(durable.URL, "locker@", "locker_app@", 1))
	for c, l := range got {
		if l != backend.Sound {
			t.Errorf("a durable server, with a role of its own: %s %v", c, l)
		}
	}
}
