package fencedpgx_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedpgx"
)

// A holder debits an account through the guard, with its lock's fence: if
// a later holder of the lock has written, the debit is refused.
func ExampleGuard_Tx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/bank")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	guard, err := fencedpgx.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	client, err := locker.Open(ctx, "postgres://app@db/bank")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lock, err := client.Acquire(ctx, "account/alice")
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)

	err = guard.Tx(ctx, "account/alice", lock.Fence(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", 30, "alice")
		return err
	})
	if errors.Is(err, fenced.ErrStale) {
		log.Print("a later holder of the lock has written: this one's lock is gone")
	}
}
