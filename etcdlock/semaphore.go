package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore of key k is the queue <prefix>/<EscapeKey(k)>%s/, its
// entries' values "<backend.PermitTag> <owner>", and Resize's record is
// <prefix>/<EscapeKey(k)>%s; which entries hold is admit's rule (see
// "Semaphores and read-write locks" in docs/backends/etcdlock.md).

var _ backend.Resizer = (*Driver)(nil)

// permitValue is the value of an entry of weight permits.
func permitValue(limit, weight int, owner string) string {
	return backend.PermitTag(limit, weight) + " " + owner
}

// permitOf is the limit (0: none) and the permits of an entry.
func permitOf(kv *mvccpb.KeyValue) (limit, weight int) {
	tag, _, _ := strings.Cut(string(kv.Value), " ")
	if limit, weight, ok := backend.ParsePermitTag(tag); ok {
		return limit, weight
	}
	return 0, 1
}

// resizeKey is the key of Resize's record of the semaphore of directory
// dir: beside it, so that no range over its entries sees it, and under
// the driver's prefix, which the driver's roles cover.
func resizeKey(dir string) string { return strings.TrimSuffix(dir, "/") }

// record is a semaphore's resize record, "<limit> <upto>": the limit
// every claim is judged under (0: removed), the creation revision of the
// last entry that held when it was written (those up to it hold whatever
// the limit), and its key's modification revision as read (0: none).
type record struct {
	limit int
	upto  int64
	mod   int64
}

// resized is the record in kvs, a read of a resize key; a limit alone
// (an earlier version's) has no holder, and a value Resize did not write
// keeps neither.
func resized(kvs []*mvccpb.KeyValue) record {
	if len(kvs) == 0 {
		return record{}
	}
	r := record{mod: kvs[0].ModRevision}
	limit, upto, found := strings.Cut(string(kvs[0].Value), " ")
	n, err := strconv.Atoi(limit)
	var u int64
	if found && err == nil {
		u, err = strconv.ParseInt(upto, 10, 64)
	}
	if err == nil && n >= 0 && n <= backend.MaxLimit {
		r.limit, r.upto = n, u
	}
	return r
}

// permits tallies the entries of a semaphore ahead of a claim, in any
// order, to judge it under record r (see admit).
type permits struct {
	r            record
	sum          int              // their permits
	first, other *mvccpb.KeyValue // the first, and the first of another limit than its
}

// add counts kv's permits, and returns them.
func (p *permits) add(kv *mvccpb.KeyValue) int {
	n, w := permitOf(kv)
	if p.first == nil {
		p.first = kv
	} else if m, _ := permitOf(p.first); p.other == nil && n != m {
		p.other = kv
	}
	p.sum += w
	return w
}

// admit returns the limit a claim of limit and weight permits behind the
// entries added is judged under, and whether it fits there: the resized
// limit if one stands (ErrLimitMismatch below the weight), else its own,
// and then ErrLimitMismatch if an entry ahead has another limit. So a
// permit granted under the entries' own limits was granted behind entries
// of its limit only, and the permits held never exceed the limit they were
// taken with, or the resized one. It is the one permit rule: a try's, a
// waiter's look's, and Inspect's holders (see holding).
func (p *permits) admit(limit, weight int) (int, bool, error) {
	if r := p.r.limit; r > 0 {
		if weight > r {
			return 0, false, backend.ResizedTo(weight, r)
		}
		limit = r
	} else {
		for _, kv := range []*mvccpb.KeyValue{p.first, p.other} {
			if kv == nil {
				break // no other without a first
			}
			if n, _ := permitOf(kv); n != limit {
				return limit, false, backend.HeldUnder(n, limit)
			}
		}
	}
	return limit, p.sum+weight <= limit, nil
}

// permitted returns the entry key among kvs, a semaphore's oldest entries
// in creation order, when it is one of r's holders or fits behind the
// entries ahead; nil otherwise.
func permitted(kvs []*mvccpb.KeyValue, key string, limit, weight int, r record) (*mvccpb.KeyValue, error) {
	p := permits{r: r}
	i := 0
	for ; i < len(kvs) && string(kvs[i].Key) != key; i++ {
		p.add(kvs[i])
	}
	if _, fits, err := p.admit(limit, weight); i == len(kvs) || !fits && kvs[i].CreateRevision > r.upto {
		return nil, err
	}
	return kvs[i], nil
}

// tryPermit puts s's entry and reads the resize key and the l.Limit
// oldest entries in one transaction: the permit is ours if our entry is
// among them and fits, else the entry goes again at once. Under a resized
// limit above l.Limit, one more read, of that many.
func (d *Driver) tryPermit(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim) (backend.Grant, error) {
	weight := max(l.Weight, 1)
	read := func(n int) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(resizeKey(s.dir)), clientv3.OpGet(s.dir, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(n)))}
	}
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		// Retried after an attempt that was applied, it does not write again.
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
			Then(append([]clientv3.Op{clientv3.OpPut(s.key, permitValue(l.Limit, weight, l.Owner), clientv3.WithLease(s.leaseOf()))}, read(l.Limit)...)...).
			Else(read(l.Limit)...)
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	rs := resp.Responses[len(resp.Responses)-2:]
	r := resized(rs[0].GetResponseRange().GetKvs())
	kvs := rs[1].GetResponseRange().GetKvs()
	mine, err := permitted(kvs, s.key, l.Limit, weight, r)
	if mine == nil && err == nil && r.limit > l.Limit && len(kvs) == l.Limit {
		resp, _, err = d.txn(ctx, run, func(ctx context.Context) clientv3.Txn { return d.cli.Txn(ctx).Then(read(r.limit)...) })
		if err == nil {
			r = resized(resp.Responses[0].GetResponseRange().GetKvs())
			kvs = resp.Responses[1].GetResponseRange().GetKvs()
			mine, err = permitted(kvs, s.key, l.Limit, weight, r)
		}
	}
	if len(kvs) > 0 {
		d.forgetRemoved(ctx, s.dir, r, kvs[0].CreateRevision)
	}
	if mine == nil {
		// Whatever its revision: an attempt whose reply was lost may have put it.
		d.remove(ctx, s, 0)
		return backend.Grant{}, cmp.Or(err, backend.ErrNotAcquired)
	}
	return d.grant(ctx, s, l, mine.CreateRevision, mine.CreateRevision)
}

// Resize implements backend.Resizer (see resize). Waiters watch the
// record (see await): a raised limit lets them in.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: resize: %w", err)
	}
	defer done()
	if err := d.resize(ctx, d.dir(key, semTag), limit); err != nil {
		return fmt.Errorf("etcdlock: resize: %w", d.gate.Failed(ctx, err))
	}
	return nil
}

// resizeTries bounds the writes of one Resize: one more each time a
// grant under the record it replaced came between its read and its write.
const resizeTries = 10

// errResizeRaced: grants kept coming between Resize's reads and writes.
var errResizeRaced = errors.New("the semaphore's holders changed at each of its writes")

// resize writes the record of the semaphore of directory dir: limit, and
// the last entry holding under the rule in force (the record read, or the
// claims' own limits), so that the holders keep their permits under a
// lowered or removed limit. Limit 0 deletes the record instead when the
// claims' own limits make the same holders; a limit that stands writes
// nothing. The write compares the record's revision as read and reads the
// directory as written over: if a claim judged under the old rule took a
// permit meanwhile that the record does not count, it writes again, with
// the running maximum of the last holders.
func (d *Driver) resize(ctx context.Context, dir string, limit int) error {
	rk := resizeKey(dir)
	entries := clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	resp, _, err := d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn { return d.cli.Txn(ctx).Then(clientv3.OpGet(rk), entries) })
	if err != nil {
		return err
	}
	old := resized(resp.Responses[0].GetResponseRange().GetKvs())
	kvs := resp.Responses[1].GetResponseRange().GetKvs()
	if old.mod != 0 && old.limit == limit && limit > 0 || old.mod == 0 && limit == 0 {
		return nil
	}
	upto := lastHolding(kvs, old)
	for range resizeTries {
		r := record{limit: limit, upto: upto}
		write := clientv3.OpPut(rk, fmt.Sprintf("%d %d", limit, upto))
		keep := limit > 0 || lastHolding(kvs, record{}) < upto
		if !keep {
			r, write = record{}, clientv3.OpDelete(rk)
		}
		resp, _, err := d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
			return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(rk), "=", old.mod)).
				Then(write, entries).Else(clientv3.OpGet(rk), entries)
		})
		if err != nil {
			return err
		}
		kvs = resp.Responses[1].GetResponseRange().GetKvs()
		if !resp.Succeeded {
			// Another Resize's record, or ours by an attempt whose reply
			// was lost: judged again from it.
			old = resized(resp.Responses[0].GetResponseRange().GetKvs())
			upto = lastHolding(kvs, old)
			continue
		}
		if keep {
			r.mod = resp.Header.Revision
		}
		last := lastHolding(kvs, old)
		if last <= lastHolding(kvs, r) {
			return nil
		}
		old, upto = r, max(upto, last)
	}
	return errResizeRaced
}

// lastHolding is the creation revision of the last of kvs, a semaphore's
// entries in creation order, that holds under record r; 0 if none does.
func lastHolding(kvs []*mvccpb.KeyValue, r record) int64 {
	if n := holding(backend.Permit, kvs, r); n > 0 {
		return kvs[n-1].CreateRevision
	}
	return 0
}

// forgetRemoved deletes the record r of the semaphore of directory dir
// when it is a removed limit's whose holders are all gone (oldest is the
// creation revision of the oldest entry left), r's revision compared; a
// failure leaves it to the next claim.
func (d *Driver) forgetRemoved(ctx context.Context, dir string, r record, oldest int64) {
	if r.mod == 0 || r.limit > 0 || oldest <= r.upto {
		return
	}
	rk := resizeKey(dir)
	d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(rk), "=", r.mod)).Then(clientv3.OpDelete(rk))
	})
}
