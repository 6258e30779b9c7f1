// Command quickstart shows the locker API: three workers share one lock
// name, each holds it in turn, and each sees a larger fencing token.
//
//	go run ./examples/quickstart                                  # in-process (mem://)
//	LOCKER_URL=redis://127.0.0.1:6379/0 go run ./examples/quickstart
//
// It registers the in-process and the Redis backends; for another store,
// add its package's blank import (etcdlock, zklock, sqllock, memcachelock,
// filelock).
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
)

func main() {
	url := os.Getenv("LOCKER_URL")
	if url == "" {
		url = "mem://"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client, err := locker.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	var wg sync.WaitGroup
	for worker := 1; worker <= 3; worker++ {
		wg.Go(func() {
			err := client.Do(ctx, "nightly-report", func(ctx context.Context) error {
				lock := locker.FromContext(ctx)
				fmt.Printf("worker %d holds %q, fence %d\n", worker, lock.Name(), lock.Fence())
				time.Sleep(100 * time.Millisecond) // the protected work
				return nil
			}, locker.TTL(5*time.Second))
			if err != nil {
				log.Printf("worker %d: %v", worker, err)
			}
		})
	}
	wg.Wait()
}
