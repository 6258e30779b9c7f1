package memlock_test

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

// Two drivers on one Store share its locks, as two clients of one server
// would; so do two drivers opened on the same mem://NAME.
func Example() {
	ctx := context.Background()

	// New, on a Store the program keeps.
	store := memlock.NewStore()
	drv, err := memlock.New(store)
	if err != nil {
		panic(err)
	}
	a, err := locker.New(drv, locker.WithNamespace("billing"))
	if err != nil {
		panic(err)
	}
	defer a.Close()

	// Open, on the process-wide Store named by the URL.
	drv2, err := memlock.Open(ctx, "mem://example")
	if err != nil {
		panic(err)
	}
	b, err := locker.New(drv2, locker.WithNamespace("billing"))
	if err != nil {
		panic(err)
	}
	defer b.Close()

	l, err := a.TryAcquire(ctx, "invoice-run")
	if err != nil {
		panic(err)
	}
	fmt.Println("fence", l.Fence())
	l.Release(ctx)
	// Output: fence 1
}
