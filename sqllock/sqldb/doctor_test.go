package sqldb

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

func diagnoseLevels(t *testing.T, db *sql.DB, d Dialect) map[string]backend.Level {
	t.Helper()
	drv, err := New(db, d)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs, err := drv.Diagnose(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]backend.Level{}
	for _, f := range fs {
		got[f.Check] = f.Level
	}
	if _, err := drv.StoreTime(ctx); err != nil {
		t.Errorf("StoreTime: %v", err)
	}
	return got
}

// The shared MariaDB flushes its log once a second (as scripts/services.sh
// configures it, for speed): unsafe; its user's grants stop at its
// database; its sessions' wait_timeout is the default 8 hours. SQLite with synchronous OFF is unsafe, with the opener's FULL
// sound.
func TestDiagnose(t *testing.T) {
	my := sqltest.MySQLDB(t, sqltest.MySQLConfig(t))
	if got := diagnoseLevels(t, my, MySQL); got["mysql.durability"] != backend.Unsafe || got["mysql.grants"] != backend.Sound || got["mysql.wait-timeout"] != backend.Warning {
		t.Errorf("the shared MariaDB (wait_timeout 8 h): %v", got)
	}
	cfg := sqltest.MySQLConfig(t)
	cfg.Params = map[string]string{"wait_timeout": "120"}
	if got := diagnoseLevels(t, sqltest.MySQLDB(t, cfg), MySQL); got["mysql.wait-timeout"] != backend.Sound {
		t.Errorf("sessions with wait_timeout 120 s: %v", got)
	}
	dir := t.TempDir()
	for sync, want := range map[string]backend.Level{"OFF": backend.Unsafe, "NORMAL": backend.Warning, "FULL": backend.Sound} {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, sync+".db")+"?_pragma=synchronous("+sync+")&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1) // one connection: the pragma holds for it
		if got := diagnoseLevels(t, db, SQLite)["sqlite.durability"]; got != want {
			t.Errorf("SQLite with synchronous %s: %v, want %v", sync, got, want)
		}
		db.Close()
	}
}
