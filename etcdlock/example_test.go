package etcdlock_test

import (
	"context"
	"log"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// New, on a client you already have (Close leaves it open), and Open, by
// URL: the endpoints of the cluster, the key prefix as the path (Close
// closes the client it made).
func Example() {
	ctx := context.Background()

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	drv, err := etcdlock.New(cli, etcdlock.WithPrefix("/locks"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(drv)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "migrations")
	if err != nil {
		log.Fatal(err)
	}
	// Pass l.Fence() to the resource the lock protects.
	defer l.Release(ctx)

	drv2, err := etcdlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?dial_timeout=5s")
	if err != nil {
		log.Fatal(err)
	}
	c2, err := locker.New(drv2, locker.WithNamespace("billing"), locker.WithDefaultTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c2.Close()
	err = c2.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the client's lease is lost.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// Opening through the registry: locker.Open takes the same URL, with the
// locker package's own parameters (namespace=, ttl=) besides.
func Example_open() {
	ctx := context.Background()
	c, err := locker.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?namespace=billing&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
