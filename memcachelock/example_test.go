package memcachelock_test

import (
	"context"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memcachelock"
)

// New, on a gomemcache client you already have (Close leaves it open), and
// Open, by URL (Close closes the client it made). Give every process the
// same server list, in the same order.
func Example() {
	ctx := context.Background()

	mc := memcache.New("10.0.0.1:11211", "10.0.0.2:11211")
	mc.Timeout = time.Second
	drv, err := memcachelock.New(mc)
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(drv, locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "invoice-42")
	if err != nil {
		log.Print(err) // errors.Is(err, locker.ErrNotAcquired) when someone else holds it
		return
	}
	defer l.Release(ctx)
	log.Printf("fence %d, effective TTL %v", l.Fence(), l.TTL())

	drv2, err := memcachelock.Open(ctx, "memcache://10.0.0.1:11211,10.0.0.2:11211?timeout=500ms",
		memcachelock.WithRestartDelay(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c2, err := locker.New(drv2, locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c2.Close()
	err = c2.Do(ctx, "nightly-report", func(ctx context.Context) error {
		return nil // ctx is cancelled if the lock is lost
	}, locker.TTL(30*time.Second))
	if err != nil {
		log.Print(err)
	}
}

// Opening through the registry: locker.Open takes the same URL, with the
// locker package's own parameters (namespace=, ttl=) besides.
func Example_open() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "memcache://10.0.0.1:11211,10.0.0.2:11211?timeout=500ms&namespace=billing")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
