package redislock_test

import (
	"context"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/redislock"
)

// Open by URL: the Driver owns the connection it dials, and the Client's
// Close closes it.
func Example() {
	ctx := context.Background()
	d, err := redislock.Open(ctx, "redis://127.0.0.1:6379/0?dial_timeout=3s")
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost; pass
		// locker.FromContext(ctx).Fence() to the resource.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// Use a client you already have (a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client); Close leaves it open.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	d, err := redislock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(context.Background(), "migrations")
	if err != nil {
		log.Fatal(err)
	}
	// Pass l.Fence() to the resource the lock protects.
	defer l.Release(context.Background())
}

// Redlock over independent servers, with clients you made.
func ExampleNewQuorum() {
	var clients []redis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		clients = append(clients, rdb)
	}
	q, err := redislock.NewQuorum(clients)
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(q)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
