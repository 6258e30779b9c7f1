package sqldb_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// A *sql.DB of one connection (SetMaxOpenConns(1), as SQLite's users
// often keep one) serves every mode: a transaction of the shared table
// never waits for a second connection (to prepare a statement), which
// the pool would never give it.
func TestPoolOfOne(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			var db *sql.DB
			var opts []sqldb.Option
			d := sqldb.SQLite
			if dialect == "mysql" {
				db, d = sqltest.MySQLDB(t, sqltest.MySQLConfig(t)), sqldb.MySQL
				opts = append(opts, sqldb.WithTable(newTable(t).Table))
			} else {
				db = sqltest.SQLiteDB(t, filepath.Join(t.TempDir(), "locks.db"))
			}
			db.SetMaxOpenConns(1)
			drv, err := sqldb.New(db, d, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { drv.Close() })
			for _, m := range []backend.Mode{backend.Exclusive, backend.Permit, backend.Read, backend.Write} {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c := backend.Claim{Key: "ns/one", Token: randHex(16), TTL: time.Minute, Mode: m, Limit: 2, Weight: 1}
				g, err := drv.TryAcquire(ctx, c)
				if err == nil {
					c.Fence = g.Fence
					err = drv.Refresh(ctx, c)
				}
				if err == nil {
					err = drv.Release(ctx, c)
				}
				cancel()
				if err != nil {
					t.Fatalf("%s: %v", m, err)
				}
			}
		})
	}
}
