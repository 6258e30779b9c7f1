// Package keyed runs tasks one key at a time across every process that
// shares a lock store: a keyed serial executor on the portable
// [locker.Client], so it works on every backend.
//
//	ex := keyed.New(client, keyed.Concurrency(16))
//	defer ex.Close()
//	err := ex.Submit(ctx, "tenant-7/order-42", func(ctx context.Context) error {
//		return apply(ctx, event) // ctx is cancelled if the key's lock is lost
//	})
//
// Each key has, on each process, a local FIFO queue and one runner. The
// runner takes the key's lock (the key is the lock name, in the Client's
// namespace) and keeps it while the queue is not empty, running the queued
// tasks one after another: one lock round trip serves a batch. A batch ends
// when the queue is empty, after [Batch]'s task count or hold time (so
// other processes get a turn), or when the lock is lost; the runner then
// releases the lock and, if tasks remain, asks for it again.
//
// # Guarantees
//
// Exclusion, on every backend: two tasks of one key never run at the same
// time, on one process or on several, as long as the lock is held (the
// backend's own guarantee; see the repository's docs/guarantees.md). A
// task's context is cancelled, with the loss as its cause, when the lock
// is lost, and [Executor.Submit] then returns an error
// wrapping [locker.ErrLost]; the tasks still queued wait for the lock
// again. A task that ignores its context may still run when another
// process gets the lock: give its fence ([LockFromContext]) to the storage
// it writes, so that the storage rejects it.
//
// Order within a process, on every backend: tasks of one key given to one
// Executor run in the order they were queued: an [Executor.Go] that returned
// before another was called is ahead of it, as is a Submit that returned
// (concurrent calls are ordered by the queue). A task whose context ends
// before it starts leaves the queue, and the rest keep their order.
//
// Order across processes is the order in which the backend grants the
// key's lock to the processes' runners. A runner asks for the lock when a
// task arrives at its empty queue, or again after a batch ends with tasks
// left. On backends that queue waiters in arrival order (etcd, ZooKeeper,
// Redis with fair=true) batches are granted in the order the runners asked,
// so a process waits at most one batch of each process that asked before
// it, and a task waits behind every task of the processes that were queued
// or holding when its runner asked. With Batch(1, ...) every task is its
// own request, in the order each process's next task asked. On the other
// backends (memory, file, plain Redis, Redis quorum, PostgreSQL, Memcached)
// waiters race for a released lock: there is no order across processes and
// no bound on how long one process's tasks wait behind another's, only
// exclusion and the order within each process.
//
// # Concurrency
//
// Up to [Concurrency] keys are worked at once on an Executor: a key's
// runner holds one slot while it waits for the lock and while it runs a
// batch, and gives it back between batches.
package keyed
