package fenced_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	_ "github.com/lockerhq/locker/memlock"
)

// Two holders of one lock write through the guard; the first, paused
// past its TTL, wakes after the second has written, and its write is
// refused.
func ExampleGuard_Tx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "fenced")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "bank.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER)")
	db.Exec("INSERT INTO accounts VALUES ('alice', 100)")
	guard, err := fenced.New(db, fenced.SQLite)
	if err != nil {
		panic(err)
	}
	if err := guard.CreateTable(ctx); err != nil {
		panic(err)
	}
	debit := func(fence uint64, amount int) error {
		return guard.Tx(ctx, "account/alice", fence, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - ? WHERE id = 'alice'", amount)
			return err
		})
	}

	client, err := locker.Open(ctx, "mem://example-fenced")
	if err != nil {
		panic(err)
	}
	defer client.Close()
	first, _ := client.Acquire(ctx, "account/alice")
	first.Release(ctx) // stands for a TTL that ran out while its holder was paused
	second, _ := client.Acquire(ctx, "account/alice")
	defer second.Release(ctx)

	fmt.Println(debit(second.Fence(), 30))
	err = debit(first.Fence(), 50) // the paused holder wakes
	fmt.Println(errors.Is(err, fenced.ErrStale))
	var balance int
	db.QueryRow("SELECT balance FROM accounts WHERE id = 'alice'").Scan(&balance)
	fmt.Println(balance)
	// Output:
	// <nil>
	// true
	// 70
}
