package sqllock_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/sqllock"
)

// New, on a pool the application already has (Close leaves it open), and
// Open, by URL (Close closes the pool it made). Lock statements run on the
// pool, each in its own autocommitted statement, never inside one of the
// application's transactions. The password may come from PGPASSWORD or
// ~/.pgpass instead of the URL.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // the driver does not close a pool it was given

	drv, err := sqllock.New(pool, sqllock.WithSchema("ops"), sqllock.WithTable("locks"))
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

	// The same table by URL, with the migrations' table: no creation.
	drv2, err := sqllock.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full&lock_schema=ops&lock_table=locks",
		sqllock.WithCreateTable(false))
	if err != nil {
		log.Fatal(err)
	}
	c2, err := locker.New(drv2, locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c2.Close()
}

// Opening through the registry: locker.Open takes the same URL, with the
// locker package's own parameters (namespace=, ttl=) besides.
func Example_open() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "postgres://app@db.example.com:5432/app?sslmode=verify-full&lock_schema=ops&lock_table=locks&namespace=billing")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
