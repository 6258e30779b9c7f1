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

// StoreTrier is implemented by drivers that wait in their own queue
// (backend.Waiter): StoreTries counts, since the driver opened, the
// attempts to take a lock that its waiting sent to the store (every
// request that could grant a waiting acquisition, first tries included),
// so that the scale workload can show whether a release wakes O(1)
// waiters or all of them (a herd) as the waiters grow. A driver whose
// waiters are woken one by one by the store (a watch on the predecessor)
// counts the requests those wake-ups make.
type StoreTrier interface {
	StoreTries() uint64
}
