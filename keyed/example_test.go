package keyed_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/keyed"
	_ "github.com/lockerhq/locker/memlock"
)

// Two Executors, as two processes would, apply the events of each account
// one at a time and in the order each received them.
func Example() {
	ctx := context.Background()
	balances := map[string]int{}
	var mu sync.Mutex // the map's, not the order's: the keys' locks keep that
	var wg sync.WaitGroup
	for range 2 {
		c, err := locker.Open(ctx, "mem://example?namespace=accounts")
		if err != nil {
			panic(err)
		}
		defer c.Close()
		ex := keyed.New(c, keyed.Concurrency(8))
		defer ex.Close()
		for _, account := range []string{"alice", "bob"} {
			wg.Go(func() {
				for range 5 {
					err := ex.Submit(ctx, account, func(ctx context.Context) error {
						mu.Lock()
						defer mu.Unlock()
						balances[account] += 10
						return nil
					})
					if err != nil {
						panic(err)
					}
				}
			})
		}
	}
	wg.Wait()
	fmt.Println(balances["alice"], balances["bob"])
	// Output: 100 100
}
