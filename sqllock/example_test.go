package sqllock_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/sqllock"
)

// Locks on a pool the application already has. Lock statements run on the
// pool, each in its own autocommitted statement, never inside one of the
// application's transactions.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // the driver does not close a pool it was given

	drv, err := sqllock.New(pool, sqllock.Schema("ops"), sqllock.Table("locks"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(drv, locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// ctx ends if the lock is lost. Pass lock.Fence() along with writes
		// to storage that can reject stale fences.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// Opening by URL, through the registry. The password may come from
// PGPASSWORD or ~/.pgpass instead of the URL.
func Example_open() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full&lock_schema=ops&lock_table=locks&namespace=billing")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
