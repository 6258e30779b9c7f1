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
// entries' values "<backend.PermitTag> <owner>"; an entry holds while the
// permits of the older ones and its own are at most the limit: the one
// Resize keeps in the key <prefix>/<EscapeKey(k)>%s if it stands, else
// the entries' own (see "Semaphores and read-write locks" in
// docs/backends/etcdlock.md).

var _ backend.Resizer = (*Driver)(nil)

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

// resizeKey is the key of the limit Resize sets on the semaphore of
// directory dir: beside it (its name without the trailing '/'), so that
// no range over the directory's entries sees it, and under the driver's
// prefix, which the driver's roles cover.
func resizeKey(dir string) string { return strings.TrimSuffix(dir, "/") }

// resized is the limit in kvs, a read of a resize key, and its
// modification revision; 0, 0 when none stands. A value that is no limit
// (not written by Resize) is none.
func resized(kvs []*mvccpb.KeyValue) (limit int, mod int64) {
	if len(kvs) == 0 {
		return 0, 0
	}
	n, err := strconv.Atoi(string(kvs[0].Value))
	if err != nil || n < 1 || n > backend.MaxLimit {
		return 0, kvs[0].ModRevision
	}
	return n, kvs[0].ModRevision
}

// under is the limit a claim of limit and weight permits is judged
// under: the resized one, r, if it stands (ErrLimitMismatch if the
// weight exceeds it), else its own.
func under(limit, weight, r int) (int, error) {
	switch {
	case r == 0:
		return limit, nil
	case weight > r:
		return 0, fmt.Errorf("%w: %d permits asked of a semaphore resized to %d", backend.ErrLimitMismatch, weight, r)
	}
	return r, nil
}

// weigh is the permits of kv, an entry ahead of a claim judged under
// limit: ErrLimitMismatch if kv is under another limit and no resized
// one (r) stands. So every permit granted under the entries' own limits
// was granted behind entries of its own limit only, and the permits held
// never exceed the limit they were taken with, or the resized one.
func weigh(kv *mvccpb.KeyValue, limit, r int) (int, error) {
	n, w := permitOf(kv)
	if r == 0 && n != limit {
		return 0, fmt.Errorf("%w: held under %d, asked with %d", backend.ErrLimitMismatch, n, limit)
	}
	return w, nil
}

// permitted walks kvs, a semaphore's oldest entries in creation order, up
// to the entry key, which it returns when the permits of the entries
// ahead and weight fit the limit it is judged under (nil otherwise); r is
// the resized limit, 0 if none.
func permitted(kvs []*mvccpb.KeyValue, key string, limit, weight, r int) (*mvccpb.KeyValue, error) {
	limit, err := under(limit, weight, r)
	if err != nil {
		return nil, err
	}
	ahead := 0
	for _, kv := range kvs {
		if string(kv.Key) == key {
			if ahead+weight > limit {
				return nil, nil
			}
			return kv, nil
		}
		w, err := weigh(kv, limit, r)
		if err != nil {
			return nil, err
		}
		ahead += w
	}
	return nil, nil
}

// tryPermit puts s's entry and reads the resize key and the semaphore's
// l.Limit oldest entries in one transaction: the permit is ours if our
// entry is among them and fits. Otherwise the entry goes again at once.
// Under a resized limit above l.Limit that the entries read may leave
// room for, one more read, of that many.
func (d *Driver) tryPermit(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim) (backend.Grant, error) {
	weight := max(l.Weight, 1)
	read := func(n int) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(resizeKey(s.dir)), clientv3.OpGet(s.dir, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(n)))}
	}
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		// Retried after an attempt that was applied, it finds our entry
		// there and does not write it again.
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
			Then(append([]clientv3.Op{clientv3.OpPut(s.key, permitValue(l.Limit, weight, l.Owner), clientv3.WithLease(s.leaseOf()))}, read(l.Limit)...)...).
			Else(read(l.Limit)...)
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	rs := resp.Responses[len(resp.Responses)-2:]
	r, _ := resized(rs[0].GetResponseRange().GetKvs())
	kvs := rs[1].GetResponseRange().GetKvs()
	mine, err := permitted(kvs, s.key, l.Limit, weight, r)
	if mine == nil && err == nil && r > l.Limit && len(kvs) == l.Limit {
		resp, _, err = d.txnRun(ctx, run, func(ctx context.Context) clientv3.Txn { return d.cli.Txn(ctx).Then(read(r)...) })
		if err == nil {
			r, _ = resized(resp.Responses[0].GetResponseRange().GetKvs())
			mine, err = permitted(resp.Responses[1].GetResponseRange().GetKvs(), s.key, l.Limit, weight, r)
		}
	}
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

// Resize implements backend.Resizer: it puts the limit, without a
// lease, in key's resize key, unless it is there already, or deletes the
// key (0). Waiters watch it (see await): a raised limit lets them in.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	if limit < 0 || limit > backend.MaxLimit {
		return fmt.Errorf("etcdlock: resize: %w: %d (want 0 to %d)", backend.ErrInvalidLimit, limit, backend.MaxLimit)
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: resize: %w", err)
	}
	defer done()
	rk := resizeKey(d.semDir(key))
	v := strconv.Itoa(limit)
	_, err = d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		if limit == 0 {
			return d.cli.Txn(ctx).Then(clientv3.OpDelete(rk))
		}
		// etcd fails a comparison of the value of a key that does not
		// exist: then it puts.
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(rk), "=", v)).Else(clientv3.OpPut(rk, v))
	})
	if err != nil {
		return fmt.Errorf("etcdlock: resize: %w", d.failed(ctx, err))
	}
	return nil
}
