package peers

// The peers' packages, so that go.mod lists them before any benchmark
// file does.
import (
	_ "github.com/bsm/redislock"
	_ "github.com/go-redsync/redsync/v4"
	_ "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	_ "github.com/go-zookeeper/zk"
	_ "go.etcd.io/etcd/client/v3/concurrency"

	_ "github.com/lockerhq/locker/internal/bench"
	_ "github.com/lockerhq/locker/internal/testenv"
)
