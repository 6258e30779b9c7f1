package locker_test

import (
	"context"
	"errors"
	"fmt"
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
