package sqldb

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// List and Inspect of semaphores page through their holders' rows: an
// object whose holders run past a page's end comes whole and once, its
// holders by fence, and the object after it too; the prefix's
// read-write locks and other prefixes stay out. Both dialects.
func TestHoldersPaged(t *testing.T) {
	t.Parallel()
	for name, d := range bothDialects(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			take := func(key string, m backend.Mode, limit int) uint64 {
				t.Helper()
				g, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: testutil.Token(), TTL: time.Minute, Mode: m, Limit: limit})
				if err != nil {
					t.Fatalf("TryAcquire %q (%v): %v", key, m, err)
				}
				return g.Fence
			}
			b := []uint64{take("hp/b", backend.Permit, 2)}
			take("hp/a", backend.Read, 0)
			take("hp/c", backend.Write, 0)
			take("hq/x", backend.Permit, 1)
			// More permits than a page, in one transaction of the grant's
			// statements: as many grants take long under -race and load.
			n := listPage + 3
			var a []uint64
			err := d.inTx(ctx, false, func(tx on) error {
				if _, err := tx.exec(d.sql.sharedAnchor, "hp/a", objSemaphore); err != nil {
					return err
				}
				for range n {
					res, err := tx.exec(d.sql.sharedInsert, "hp/a", objSemaphore, testutil.Token(), kindPermit, "", n, time.Minute.Microseconds())
					if err != nil {
						return err
					}
					f, err := res.LastInsertId()
					a = append(a, uint64(f))
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, st backend.State, key string, fences []uint64) {
				t.Helper()
				var got []uint64
				for _, h := range st.Holders {
					got = append(got, h.Fence)
				}
				if st.Key != key || !st.Held || !slices.Equal(got, fences) || st.Limit != map[string]int{"hp/a": n, "hp/b": 2}[key] {
					t.Fatalf("%s = %s (limit %d) with %d holders, want %s with %d by fence", what, st.Key, st.Limit, len(got), key, len(fences))
				}
			}
			all, err := d.List(ctx, "hp/", backend.Permit)
			if err != nil || len(all) != 2 {
				t.Fatalf("List = %d semaphores, %v; want hp/a and hp/b", len(all), err)
			}
			check("List[0]", all[0], "hp/a", a)
			check("List[1]", all[1], "hp/b", b)
			st, err := d.Inspect(ctx, "hp/a", backend.Permit)
			if err != nil {
				t.Fatal(err)
			}
			check("Inspect", st, "hp/a", a)
		})
	}
}

// bothDialects returns a driver of each dialect, on a database of its
// own, closed at cleanup.
func bothDialects(t *testing.T) map[string]*Driver {
	t.Helper()
	lite, _ := sqliteDriver(t)
	h := sqltest.NewMySQL(t, func(ctx context.Context, table string) (backend.Driver, error) {
		return New(sqltest.MySQLDB(t, sqltest.MySQLConfig(t)), MySQL, WithTable(table))
	})
	my, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	return map[string]*Driver{"sqlite": lite, "mysql": my.(*Driver)}
}
