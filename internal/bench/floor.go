package bench

import "context"

// Floorer is implemented by drivers that can run, on their own connections,
// the bare store operations any lock's acquire+release costs at least: the
// raw floor a lock's cycle is compared with, in the same run, interleaved
// (for example Redis: SET key NX PX, then a compare-and-delete script;
// PostgreSQL: INSERT … ON CONFLICT DO NOTHING, then DELETE; memcached: add,
// then delete; etcd: the put-if-absent Txn and delete of
// concurrency.Mutex; ZooKeeper: create and delete an ephemeral node).
// RawFloor leaves nothing behind, and key is never a lock's key.
type Floorer interface {
	RawFloor(ctx context.Context, key string) error
}
