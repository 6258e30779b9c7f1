package etcdlock

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Lister    = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// known is what a queue directory records: the holders' entries (owner,
// fence and lease) and the waiters' behind them.
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL | backend.KnowsWaiters | backend.KnowsQueue

// listPage bounds the keys of one read of List.
const listPage = 1000

// Inspect implements backend.Inspector: one read of the object's
// directory (see readObject), and one of each holder's lease.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	m = backend.Object(m)
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	_, st, leases, err := d.readObject(ctx, key, m)
	if err != nil {
		return backend.State{}, err
	}
	return d.withTTLs(ctx, st, leases)
}

// readObject reads the directory of key's object m in creation order
// (a read-write lock's readers and writers together), and in the same
// range a semaphore's resize record, whose key sorts just before it, and
// describes the object (see stateOf).
func (d *Driver) readObject(ctx context.Context, key string, m backend.Mode) ([]*mvccpb.KeyValue, backend.State, []clientv3.LeaseID, error) {
	tag, ok := tags[m]
	if !ok {
		return nil, backend.State{}, nil, fmt.Errorf("etcdlock: %w: mode %v", backend.ErrUnsupported, m)
	}
	dir := d.dir(key, tag)
	from := dir
	if m == backend.Permit {
		from = resizeKey(dir)
	}
	resp, err := d.get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(dir)),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, backend.State{}, nil, fmt.Errorf("etcdlock: %w", d.gate.Failed(ctx, err))
	}
	kvs := resp.Kvs
	var r record
	if i := slices.IndexFunc(kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == from }); from != dir && i >= 0 {
		r = resized(kvs[i : i+1])
		kvs = slices.Delete(kvs, i, i+1)
	}
	st, leases := stateOf(key, m, kvs, r)
	return kvs, st, leases, nil
}

// holding counts the entries of object m that hold it, the first of kvs
// (in creation order): the lock's first; a semaphore's first, those up to
// its record r's last holder, and the next ones while each fits behind
// those ahead (see admit); a read-write lock's first writer alone, or its
// readers up to the first writer (see "Semaphores and read-write locks"
// in the docs).
func holding(m backend.Mode, kvs []*mvccpb.KeyValue, r record) int {
	switch {
	case len(kvs) == 0:
		return 0
	case m == backend.Exclusive:
		return 1
	case m == backend.Permit:
		p := permits{r: r}
		for i, kv := range kvs {
			// The oldest holds whatever its weight: one above a lowered
			// limit was granted before it, a waiter leaves at its look.
			if n, w := permitOf(kv); i > 0 && kv.CreateRevision > r.upto {
				if _, fits, _ := p.admit(n, w); !fits {
					return i
				}
			}
			p.add(kv)
		}
		return len(kvs)
	}
	if i := slices.IndexFunc(kvs, writes); i >= 0 {
		return max(i, 1)
	}
	return len(kvs)
}

// writes reports whether kv is a read-write lock's writer's entry: its
// directory is %r/w/, a reader's %r/r/.
func writes(kv *mvccpb.KeyValue) bool {
	dir := kv.Key[:bytes.LastIndexByte(kv.Key, '/')]
	return bytes.HasSuffix(dir, []byte("/w"))
}

// stateOf describes object m of key from its directory's entries, oldest
// first, and a semaphore's record r, but for the TTLs (see leaseTTLs),
// and returns the lock's holder's lease, or one per Holders entry.
func stateOf(key string, m backend.Mode, kvs []*mvccpb.KeyValue, r record) (backend.State, []clientv3.LeaseID) {
	st := backend.State{Key: key, Mode: m, Known: known.For(m), Limit: r.limit}
	n := holding(m, kvs, r)
	var leases []clientv3.LeaseID
	for i, kv := range kvs {
		owner := string(kv.Value)
		if m == backend.Permit {
			_, owner, _ = strings.Cut(owner, " ")
		}
		if i >= n {
			st.Waiters++
			st.Queue = append(st.Queue, owner)
			continue
		}
		st.Held = true
		leases = append(leases, clientv3.LeaseID(kv.Lease))
		if m == backend.Exclusive {
			st.Owner, st.Fence = owner, uint64(kv.CreateRevision)
			continue
		}
		h := backend.Holder{Mode: m, Owner: owner, Fence: uint64(kv.CreateRevision), Weight: 1}
		switch {
		case m == backend.Permit:
			var n int
			n, h.Weight = permitOf(kv)
			st.Limit = cmp.Or(st.Limit, n) // the oldest's, which the others are judged under
		case writes(kv):
			h.Mode = backend.Write
		}
		st.Holders = append(st.Holders, h)
	}
	return st, leases
}

// List implements backend.Lister: it reads the directories whose escaped
// name starts with prefix's, in pages from one snapshot, keeps the held
// objects m, and asks for the time left of each holder's lease.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	m = backend.Object(m)
	tag, ok := tags[m]
	if !ok {
		return nil, fmt.Errorf("etcdlock: %w: mode %v", backend.ErrUnsupported, m)
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	base := d.prefix + "/"
	start := base
	if strings.Trim(prefix, ".") != "" {
		// EscapeKey escapes byte by byte but for the keys "." and ".."
		// (%2E): a prefix of dots only is matched on the client.
		start += backend.EscapeKey(prefix)
	}
	end := clientv3.GetPrefixRangeEnd(start)
	dirs := map[string][]*mvccpb.KeyValue{} // by escaped name and tag
	resizes := map[string]record{}          // the semaphores', by escaped name and tag
	var rev int64
	for from := start; ; {
		resp, err := d.get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(listPage), clientv3.WithRev(rev))
		if err != nil {
			return nil, fmt.Errorf("etcdlock: %w", d.gate.Failed(ctx, err))
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			name, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), base), "/")
			if ok {
				dirs[name] = append(dirs[name], kv)
			} else if m == backend.Permit {
				resizes[name] = resized([]*mvccpb.KeyValue{kv}) // a resize key, named as its directory
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	var (
		out    []backend.State
		leases [][]clientv3.LeaseID // of out's holders
	)
	for dir, kvs := range dirs {
		// Another object's name keeps its tag, which no escaped key has.
		name, ok := strings.CutSuffix(dir, tag)
		key, err := url.PathUnescape(name)
		if !ok || err != nil || !strings.HasPrefix(key, prefix) || backend.EscapeKey(key) != name {
			continue // not a name of ours
		}
		slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
		if st, ls := stateOf(key, m, kvs, resizes[dir]); st.Held {
			out = append(out, st)
			leases = append(leases, ls)
		}
	}
	if err := d.leaseTTLs(ctx, out, leases); err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	return out, nil
}

// leaseTTLs sets the TTLs of sts from their holders' leases (leases[i]
// of sts[i]), asking once per lease, a few at a time, in whole seconds
// (rounded down); a holder's lease gone or about to expire, with its
// entries, clears its state's KnowsTTL.
func (d *Driver) leaseTTLs(ctx context.Context, sts []backend.State, leases [][]clientv3.LeaseID) error {
	ids := slices.Compact(slices.Sorted(slices.Values(slices.Concat(leases...))))
	left := make([]time.Duration, len(ids))
	err := cmp.Or(parallel.Each(len(ids), 16, func(i int) error {
		var resp *clientv3.LeaseTimeToLiveResponse
		_, err := d.resend(ctx, new(retry.Failing), func(ctx context.Context) (err error) {
			resp, err = d.cli.TimeToLive(ctx, ids[i])
			return err
		})
		if err == nil {
			left[i] = time.Duration(max(resp.TTL, 0)) * time.Second
		} else if !isLeaseNotFound(err) {
			return d.gate.Failed(ctx, err)
		}
		return nil
	})...)
	if err != nil {
		return err
	}
	for i, holders := range leases {
		st := &sts[i]
		for j, id := range holders {
			k, _ := slices.BinarySearch(ids, id)
			switch t := left[k]; {
			case t == 0:
				st.Known &^= backend.KnowsTTL
			case st.Mode == backend.Exclusive:
				st.TTL = t
			default:
				st.Holders[j].TTL = t
			}
		}
	}
	return nil
}

// withTTLs is st with the TTLs of its holders' leases (see leaseTTLs).
func (d *Driver) withTTLs(ctx context.Context, st backend.State, leases []clientv3.LeaseID) (backend.State, error) {
	sts := []backend.State{st}
	if err := d.leaseTTLs(ctx, sts, [][]clientv3.LeaseID{leases}); err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	return sts[0], nil
}

// Break implements backend.Breaker: it deletes the holder's entry whose
// creation revision is fence, that revision compared, so an entry put
// since under the same key is never deleted. The next grant's entry is
// younger, its fence above; waiters see the entry go as at a release, and
// the removed holder's driver at its next check (see verify) or Refresh.
// A delayed holder's entry goes too, which ends its delay.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	m = backend.Object(m)
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	kvs, st, leases, err := d.readObject(ctx, key, m)
	if err != nil {
		return backend.State{}, err
	}
	// The holders' entries are the first ones, one per lease.
	i := slices.IndexFunc(kvs[:len(leases)], func(kv *mvccpb.KeyValue) bool { return uint64(kv.CreateRevision) == fence })
	if i < 0 {
		return backend.State{}, fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	kv := kvs[i]
	if m != backend.Exclusive {
		st.Holders = st.Holders[i : i+1]
	}
	if st, err = d.withTTLs(ctx, st, leases[i:i+1]); err != nil {
		return backend.State{}, err
	}
	tresp, ambiguous, err := d.deleteEntry(ctx, string(kv.Key), kv.CreateRevision)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", d.gate.Failed(ctx, err))
	}
	// After an attempt whose reply was lost, an entry found gone was most
	// likely deleted by that attempt.
	if !tresp.Succeeded && !ambiguous {
		return backend.State{}, fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	return st, nil
}
