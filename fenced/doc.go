// Package fenced closes the loop a fencing token opens: the store a lock
// protects refuses the writes of a holder whose lock has passed to someone
// else. A holder paused past its TTL (a GC pause, a frozen VM) still
// believes it holds the lock when it wakes; its fence is then below the
// next holder's, and a store that remembers the highest fence it has seen
// for a resource can refuse it.
//
// This package guards a table of a SQL database through database/sql
// (PostgreSQL, MySQL/MariaDB and SQLite): each guarded transaction first
// moves the resource's fence up to the holder's, under the row's lock, and
// fails with [ErrStale] if a higher one was seen. Package fencedpgx does
// the same on a pgx pool or connection, fencedredis guards Redis keys,
// fencedetcd etcd keys. Each refuses only what comes after a
// later holder's first guarded write: the guard orders the writers, it
// does not know who holds the lock.
//
//	g, err := fenced.New(db, fenced.Postgres)
//	err = g.Tx(ctx, "account/alice", lock.Fence(), func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", amount, "alice")
//		return err
//	})
//	if errors.Is(err, fenced.ErrStale) {
//		// Someone with a later lock has written: this holder's lock is gone.
//	}
//
// Fences of one resource must come from one lock name (any backend of this
// project): fences of different names are not ordered.
//
// The last moment before an irreversible action that no store can guard
// (an e-mail, a payment), ask the lock store itself: Lock.Refresh returns
// an error wrapping locker.ErrNotHeld once the lock is not this holder's.
// It narrows the race to the refresh's round trip and what follows; it
// does not close it, which only a guarded store does.
package fenced
