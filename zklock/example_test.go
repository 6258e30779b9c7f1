package zklock_test

import (
	"context"
	"log"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/zklock"
)

// Open by URL: the servers of the ensemble, the root node as the path. The
// driver owns the connection it opens; Close ends its session.
func Example() {
	ctx := context.Background()
	drv, err := zklock.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/locks?session_timeout=10s")
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(drv)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the session, and so the lock, is lost.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// Use a connection you already have; Close leaves it open. New waits for
// the connection's session (WithConnectTimeout bounds the wait).
// WithSessionTimeout tells the driver the session timeout of conn.
func ExampleNew() {
	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	drv, err := zklock.New(conn, zklock.WithRoot("/locks"), zklock.WithSessionTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c, err := locker.New(drv)
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
