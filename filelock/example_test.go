package filelock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/filelock"
)

// Two drivers on one directory share its locks, as two processes of one
// machine would.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "locks")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// New, on a directory the program chose.
	drv, err := filelock.New(dir)
	if err != nil {
		panic(err)
	}
	a, err := locker.New(drv, locker.WithNamespace("billing"))
	if err != nil {
		panic(err)
	}
	defer a.Close()

	// Open, with a URL: here the same directory, without the fsync.
	drv2, err := filelock.Open(ctx, "file://"+filepath.ToSlash(dir)+"?sync=false")
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
	_, err = b.TryAcquire(ctx, "invoice-run")
	fmt.Println("fence", l.Fence(), "second holder:", err != nil)
	l.Release(ctx)
	// Output: fence 1 second holder: true
}
