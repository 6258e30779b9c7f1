package etcdlock

import (
	"context"
	"fmt"
	"strings"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore of key k is the queue <prefix>/<EscapeKey(k)>%s/, its
// entries' values "<backend.PermitTag> <owner>"; an entry holds while the
// permits of the older ones and its own are at most the limit (see
// "Semaphores and read-write locks" in docs/backends/etcdlock.md).

// permitValue is the value of an entry of weight permits.
func permitValue(limit, weight int, owner string) string {
	return backend.PermitTag(limit, weight) + " " + owner
}

// permitOf is the limit and the permits of an entry; a limit of 0 if it
// has none.
func permitOf(kv *mvccpb.KeyValue) (limit, weight int) {
	tag, _, _ := strings.Cut(string(kv.Value), " ")
	if limit, weight, ok := backend.ParsePermitTag(tag); ok {
		return limit, weight
	}
	return 0, 1
}

// permitted walks kvs, a semaphore's oldest entries in creation order, up
// to the entry key, which it returns when the permits of the entries
// ahead and weight fit limit (nil otherwise). An entry ahead of key's
// under another limit is ErrLimitMismatch: so every permit granted was
// granted behind entries of its own limit only, and the permits held
// never exceed the limit they were taken with.
func permitted(kvs []*mvccpb.KeyValue, key string, limit, weight int) (*mvccpb.KeyValue, error) {
	ahead := 0
	for _, kv := range kvs {
		if string(kv.Key) == key {
			if ahead+weight > limit {
				return nil, nil
			}
			return kv, nil
		}
		n, w := permitOf(kv)
		if n != limit {
			return nil, limitMismatch(n, limit)
		}
		ahead += w
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
			Then(clientv3.OpPut(s.key, permitValue(l.Limit, max(l.Weight, 1), l.Owner), clientv3.WithLease(s.leaseOf())), first).
			Else(first)
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().GetKvs()
	mine, err := permitted(kvs, s.key, l.Limit, max(l.Weight, 1))
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
