package etcdlock_test

import (
	"context"
	"log"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Open by URL: the endpoints of the cluster, the key prefix as the path.
func Example() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?namespace=billing&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the client's lease is lost.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// Use a client you already have; Close leaves it open.
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	c, err := locker.New(etcdlock.New(cli, etcdlock.WithPrefix("/locks")))
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
