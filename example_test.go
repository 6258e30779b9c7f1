package locker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/memlock"
)

func Example() {
	ctx := context.Background()
	client, err := locker.Open(ctx, "mem://example?namespace=billing")
	if err != nil {
		panic(err)
	}
	defer client.Close()

	err = client.Do(ctx, "invoice-run", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost; pass the fence to the
		// resource so it can refuse a stale holder.
		fmt.Println("fence", locker.FromContext(ctx).Fence())
		return nil
	}, locker.TTL(10*time.Second))
	fmt.Println("err", err)
	// Output:
	// fence 1
	// err <nil>
}

func ExampleClient_TryAcquire() {
	ctx := context.Background()
	a, _ := locker.Open(ctx, "mem://tryacquire")
	b, _ := locker.Open(ctx, "mem://tryacquire")
	defer a.Close()
	defer b.Close()

	held, _ := a.TryAcquire(ctx, "cron/cleanup")
	_, err := b.TryAcquire(ctx, "cron/cleanup")
	fmt.Println(errors.Is(err, locker.ErrNotAcquired))
	held.Release(ctx)
	// Output: true
}

func ExampleReentrant() {
	ctx := context.Background()
	client, _ := locker.Open(ctx, "mem://reentrant")
	defer client.Close()

	outer, _ := client.Acquire(ctx, "tenant/42", locker.Reentrant("request-7"))
	inner, _ := client.Acquire(ctx, "tenant/42", locker.Reentrant("request-7")) // at once
	fmt.Println(outer.Fence() == inner.Fence())
	inner.Release(ctx) // still held
	outer.Release(ctx) // freed
	// Output: true
}

// A transfer holds both accounts, whichever way round it names them, and
// passes each account's fence with the write to it: the ledger refuses a
// write with a fence below one it has seen, the write of a holder whose
// lock has since passed to someone else. In SQL the same check is
// UPDATE accounts SET balance = balance + $1, fence = $2 WHERE id = $3 AND fence <= $2.
func ExampleClient_DoAll() {
	ctx := context.Background()
	client, err := locker.Open(ctx, "mem://example-transfer")
	if err != nil {
		panic(err)
	}
	defer client.Close()
	accounts := &ledger{balance: map[string]int{"alice": 100, "bob": 0}, fence: map[string]uint64{}}

	transfer := func(from, to string, amount int) error {
		return client.DoAll(ctx, []string{"account/" + from, "account/" + to}, func(ctx context.Context, locks *locker.LockSet) error {
			if err := accounts.add(from, -amount, locks.Fence("account/"+from)); err != nil {
				return err
			}
			return accounts.add(to, amount, locks.Fence("account/"+to))
		})
	}
	fmt.Println(transfer("alice", "bob", 30), transfer("bob", "alice", 10))
	fmt.Println(accounts.balance)
	// Output:
	// <nil> <nil>
	// map[alice:80 bob:20]
}

// ledger stands for the store the locks protect.
type ledger struct {
	mu      sync.Mutex
	balance map[string]int
	fence   map[string]uint64 // the highest fence each account has seen
}

func (l *ledger) add(account string, amount int, fence uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fence < l.fence[account] {
		return fmt.Errorf("%s: fence %d is below %d: a later holder has written", account, fence, l.fence[account])
	}
	l.fence[account] = fence
	l.balance[account] += amount
	return nil
}

// An operator sees who holds a semaphore's permits, frees one stuck
// holder by its fence, and lowers the limit while the semaphore is in use:
// the holders keep their permits, new grants wait until they are within
// it.
func ExampleClient_Resize() {
	ctx := context.Background()
	client, err := locker.Open(ctx, "mem://example-resize")
	if err != nil {
		panic(err)
	}
	defer client.Close()
	pool := locker.Semaphore(3)
	a, _ := client.TryAcquire(ctx, "db-pool", pool, locker.Label("worker-a"))
	b, _ := client.TryAcquire(ctx, "db-pool", pool, locker.Permits(2), locker.Label("worker-b"))
	defer a.Release(ctx)

	st, _ := client.Inspect(ctx, "db-pool", pool)
	for _, h := range st.Holders {
		fmt.Printf("%s holds %d of %d (fence %d)\n", h.Owner, h.Weight, st.Limit, h.Fence)
	}
	_, err = client.ForceRelease(ctx, "db-pool", b.Fence(), pool)
	fmt.Println("freed worker-b:", err == nil, "worker-b learns it:", b.Refresh(ctx) != nil)

	_ = client.Resize(ctx, "db-pool", 1) // worker-a keeps its permit
	_, err = client.TryAcquire(ctx, "db-pool", pool)
	fmt.Println(errors.Is(err, locker.ErrNotAcquired))
	// Output:
	// worker-a holds 1 of 3 (fence 1)
	// worker-b holds 2 of 3 (fence 2)
	// freed worker-b: true worker-b learns it: true
	// true
}
