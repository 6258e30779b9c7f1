package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore of key k is the queue <prefix>/<EscapeKey(k)>%s/, its
// entries' values "<limit> <owner>"; the limit oldest hold permits (see
// "Semaphores and read-write locks" in docs/backends/etcdlock.md).

// permitValue is the value of a permit's entry.
func permitValue(limit int, owner string) string {
	return strconv.Itoa(limit) + " " + owner
}

// limitOf is the limit of a permit's entry; 0 if it has none.
func limitOf(kv *mvccpb.KeyValue) int {
	s, _, _ := strings.Cut(string(kv.Value), " ")
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return n
}

// permitted walks kvs, a semaphore's oldest entries in creation order, up
// to the entry key, which it returns (nil if absent). An entry ahead of
// key's under another limit is ErrLimitMismatch: so every permit granted
// was granted behind entries of its own limit only, and the permits held
// never exceed the limit they were taken with.
func permitted(kvs []*mvccpb.KeyValue, key string, limit int) (*mvccpb.KeyValue, error) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv, nil
		}
		if n := limitOf(kv); n != limit {
			return nil, limitMismatch(n, limit)
		}
	}
	return nil, nil
}

func limitMismatch(held, asked int) error {
	return fmt.Errorf("%w: held under %d, asked with %d", backend.ErrLimitMismatch, held, asked)
}

// tryPermit puts s's entry and reads the semaphore's l.Limit oldest
// entries in one transaction: the permit is ours if our entry is among
// them. Otherwise the entry goes again at once.
func (d *Driver) tryPermit(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim) (backend.Grant, error) {
	first := clientv3.OpGet(s.dir, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(l.Limit)))
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		// Retried after an attempt that was applied, it finds our entry
		// there and does not write it again.
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
			Then(clientv3.OpPut(s.key, permitValue(l.Limit, l.Owner), clientv3.WithLease(s.leaseOf())), first).
			Else(first)
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().GetKvs()
	mine, err := permitted(kvs, s.key, l.Limit)
	if mine == nil {
		if err == nil {
			err = backend.ErrNotAcquired
		}
		// Ours, whatever its revision: deleted even when an attempt whose
		// reply was lost put it.
		d.remove(ctx, s, 0)
		return backend.Grant{}, err
	}
	return d.grant(ctx, s, l, mine.CreateRevision, mine.CreateRevision)
}
