package etcdlock

import (
	"cmp"
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

var _ backend.SetAcquirer = (*Driver)(nil)

// maxTxnOps is etcd's default --max-txn-ops: the most operations a
// transaction's server takes in each of its lists (compares, then, else).
// A larger transaction fails, whatever the locks' state.
const maxTxnOps = 128

// TryAcquireAll implements backend.SetAcquirer: one transaction puts every
// claim's entry if no entry is under any of their directories (see
// trySet); every fence is then the transaction's revision. A set whose
// compares (two a claim) exceed maxTxnOps is ErrUnsupported: the Client
// takes it name by name.
func (d *Driver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	if 2*len(claims) > maxTxnOps {
		return nil, fmt.Errorf("etcdlock: try-acquire: a set of %d names, more than one transaction takes: %w", len(claims), backend.ErrUnsupported)
	}
	for _, l := range claims {
		if l.Mode != backend.Exclusive || l.Delay > 0 || l.TTL != claims[0].TTL {
			return nil, fmt.Errorf("etcdlock: try-acquire: a set of claims that differ, or not exclusive: %w", backend.ErrUnsupported)
		}
	}
	return d.tryAcquire(ctx, claims)
}

// trySet puts the entries of ss, on their session's lease or their mark
// lease, if no entry is under overs (a lock's or a read-write lock's
// directory; a reader's: its writers'), in one transaction.
func (d *Driver) trySet(ctx context.Context, run *retry.Failing, ss []*slot, claims []backend.Claim, overs []string) ([]backend.Grant, error) {
	var ifs []clientv3.Cmp
	var puts, gets []clientv3.Op
	for i, s := range ss {
		ifs = append(ifs, clientv3.Compare(clientv3.CreateRevision(overs[i]), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0))
		puts = append(puts, clientv3.OpPut(s.key, claims[i].Owner, clientv3.WithLease(s.leaseOf())))
		gets = append(gets, clientv3.OpGet(s.key, clientv3.WithKeysOnly()))
	}
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(ifs...).Then(puts...).Else(gets...)
	})
	if err != nil {
		for _, s := range ss[1:] {
			d.failedPut(ctx, s, err)
		}
		return nil, d.failedPut(ctx, ss[0], err)
	}
	revs := make([]int64, len(ss))
	if !resp.Succeeded {
		// Our entries are there only if an earlier attempt was applied
		// although its reply was lost: then all of them, with one revision.
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				revs[i] = kvs[0].CreateRevision
			}
		}
		if revs[0] == 0 {
			for _, s := range ss {
				d.free(s)
			}
			return nil, backend.ErrNotAcquired
		}
	}
	gs := make([]backend.Grant, len(ss))
	for i, s := range ss {
		rev := cmp.Or(revs[i], resp.Header.Revision)
		if gs[i], err = d.grant(ctx, s, claims[i], rev, rev); err != nil {
			// The lease was lost meanwhile: grant removed this entry; the
			// ones before it go too, and the ones after it are removed.
			for j := range ss {
				if j < i {
					c := claims[j]
					c.Fence = gs[j].Fence
					d.Release(ctx, c)
				} else if j > i {
					d.remove(ctx, ss[j], rev)
				}
			}
			return nil, err
		}
	}
	return gs, nil
}

// ReleaseAll implements backend.SetAcquirer: it deletes the claims'
// entries in one request, and reports ErrNotHeld unless the key deleted
// was the entry of the claim's fence. A plain delete, faster than a
// compare-and-delete: no other acquisition's entry has our reserved name,
// so a retry never deletes a newer lock, nor an attempt that lands late
// (the name is spent: see slot; "How locks are stored").
// Past maxTxnOps claims, one transaction per maxTxnOps.
func (d *Driver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	if len(claims) > maxTxnOps {
		return append(d.ReleaseAll(ctx, claims[:maxTxnOps]), d.ReleaseAll(ctx, claims[maxTxnOps:])...)
	}
	errs := make([]error, len(claims))
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("etcdlock: %w", err)
		}
		return errs
	}
	defer done()
	es := make([]*entry, len(claims))
	var dels []clientv3.Op
	for i, l := range claims {
		e, err := d.lookup(l)
		if err == nil && !d.forget(e) {
			err = fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		es[i] = e
		dels = append(dels, clientv3.OpDelete(e.s.key, clientv3.WithPrevKV()))
	}
	if len(dels) == 0 {
		return errs
	}
	op := dels[0] // alone, not in a transaction
	if len(dels) > 1 {
		op = clientv3.OpTxn(nil, dels, nil)
	}
	var resp clientv3.OpResponse
	ambiguous, err := d.resend(ctx, new(retry.Failing), func(ctx context.Context) (err error) {
		resp, err = d.cli.Do(ctx, op)
		return err
	})
	k := 0
	for i, e := range es {
		if e == nil {
			continue
		}
		if ambiguous || err != nil {
			d.spend(e.s) // a plain delete
		}
		if err != nil {
			d.orphan(e.s, e.rev)
			errs[i] = fmt.Errorf("etcdlock: %w (the driver keeps trying in the background)", err)
			continue
		}
		d.free(e.s)
		var prev []*mvccpb.KeyValue
		if len(dels) == 1 {
			prev = resp.Del().PrevKvs
		} else {
			prev = resp.Txn().Responses[k].GetResponseDeleteRange().GetPrevKvs()
		}
		k++
		// After an attempt whose reply was lost, an entry found gone was
		// most likely deleted by that attempt.
		if len(prev) > 0 && prev[0].CreateRevision != e.rev || len(prev) == 0 && !ambiguous {
			errs[i] = fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
		}
	}
	return errs
}
