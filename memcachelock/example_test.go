package memcachelock_test

import (
	"context"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memcachelock"
)

// Open a Client by URL: the server list, in the same order in every process.
func Example_open() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "memcache://10.0.0.1:11211,10.0.0.2:11211?timeout=500ms&namespace=billing")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
		return nil // ctx is cancelled if the lock is lost
	}, locker.TTL(30*time.Second))
	if err != nil {
		log.Print(err)
	}
}

// Use a gomemcache client you already have; Close leaves it open.
func ExampleNew() {
	mc := memcache.New("10.0.0.1:11211", "10.0.0.2:11211")
	mc.Timeout = time.Second
	c, err := locker.New(memcachelock.New(mc), locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "invoice-42")
	if err != nil {
		log.Print(err) // errors.Is(err, locker.ErrNotAcquired) when someone else holds it
		return
	}
	defer l.Release(context.Background())
	log.Printf("fence %d, effective TTL %v", l.Fence(), l.TTL())
}
