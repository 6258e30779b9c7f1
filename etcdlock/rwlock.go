package etcdlock

import (
	"context"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A read-write lock of key k is one queue in two directories,
// <prefix>/<EscapeKey(k)>%r/r/ for readers and .../w/ for writers, in
// creation order across both: a reader goes ahead when no writer's entry
// is older than its own, a writer when no entry at all is. A waiting
// writer's entry thus keeps every later reader out (no starvation), and a
// try-acquire of Write is the lock's (the whole queue empty).

// tryRead puts s's entry if no writer holds the key or waits for it, in
// one transaction.
func (d *Driver) tryRead(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim, writers string) (backend.Grant, error) {
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(writers), "=", 0).WithPrefix(),
				clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
			Then(clientv3.OpPut(s.key, l.Owner, clientv3.WithLease(s.ls.id))).
			Else(clientv3.OpGet(s.key, clientv3.WithKeysOnly()))
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			d.free(s)
			return backend.Grant{}, backend.ErrNotAcquired
		}
		// An earlier attempt of ours was applied although its reply was
		// lost: no writer was there then.
		rev = kvs[0].CreateRevision
	}
	return d.grant(ctx, s, l, rev)
}
