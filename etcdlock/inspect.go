package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Lister    = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// known is what a queue directory records: the holder's entry (its value
// is the owner, its creation revision the fence, its lease the time left)
// and the waiters' entries behind it, in creation order.
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL | backend.KnowsWaiters | backend.KnowsQueue

// listPage bounds the keys of one read of List.
const listPage = 1000

// Inspect implements backend.Inspector: one read of key's queue directory,
// and one of the holder's lease for its time left.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	resp, err := d.get(ctx, d.Dir(key), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", d.failed(ctx, err))
	}
	st := stateOf(key, resp.Kvs)
	if st.Held {
		if err := d.leaseTTL(ctx, &st, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
			return backend.State{}, fmt.Errorf("etcdlock: %w", err)
		}
	}
	return st, nil
}

// stateOf describes a queue directory from its entries, oldest first: the
// first is the holder's (a waiter queues behind every older entry, and
// TryAcquire writes only into an empty directory). The TTL is left to
// leaseTTL.
func stateOf(key string, kvs []*mvccpb.KeyValue) backend.State {
	st := backend.State{Key: key, Known: known}
	if len(kvs) == 0 {
		return st
	}
	st.Held, st.Owner, st.Fence = true, string(kvs[0].Value), uint64(kvs[0].CreateRevision)
	st.Waiters = len(kvs) - 1
	for _, kv := range kvs[1:] {
		st.Queue = append(st.Queue, string(kv.Value))
	}
	return st
}

// leaseTTL sets st.TTL to the time the server gives the holder's lease,
// in whole seconds (rounded down). A lease the server no longer has, or
// one about to expire, gives no TTL: the entry goes with it.
func (d *Driver) leaseTTL(ctx context.Context, st *backend.State, id clientv3.LeaseID) error {
	var resp *clientv3.LeaseTimeToLiveResponse
	_, err := d.resend(ctx, new(retry.Failing), func(ctx context.Context) (err error) {
		resp, err = d.cli.TimeToLive(ctx, id)
		return err
	})
	switch {
	case isLeaseNotFound(err):
		st.Known &^= backend.KnowsTTL
		return nil
	case err != nil:
		return d.failed(ctx, err)
	case resp.TTL <= 0:
		st.Known &^= backend.KnowsTTL
	default:
		st.TTL = time.Duration(resp.TTL) * time.Second
	}
	return nil
}

// List implements backend.Lister. It reads every entry under the queue
// directories whose escaped name starts with prefix's, in pages from one
// snapshot of the store, then asks for the time left of each holder's
// lease (once per lease).
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	base := d.prefix + "/"
	start := base + escapedPrefix(prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	dirs := map[string][]*mvccpb.KeyValue{} // by escaped name
	var rev int64
	for from := start; ; {
		resp, err := d.get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(listPage), clientv3.WithRev(rev))
		if err != nil {
			return nil, fmt.Errorf("etcdlock: %w", d.failed(ctx, err))
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			name, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), base), "/")
			if ok {
				dirs[name] = append(dirs[name], kv)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	var (
		out    []backend.State
		leases []clientv3.LeaseID // of out's holders
	)
	for name, kvs := range dirs {
		key, err := url.PathUnescape(name)
		if err != nil || !strings.HasPrefix(key, prefix) || backend.EscapeKey(key) != name {
			continue // not a name of ours
		}
		slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
		out = append(out, stateOf(key, kvs))
		leases = append(leases, clientv3.LeaseID(kvs[0].Lease))
	}
	if err := d.leaseTTLs(ctx, out, leases); err != nil {
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	slices.SortFunc(out, func(a, b backend.State) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// escapedPrefix is the start that the escaped form of every key with
// prefix p has. EscapeKey escapes byte by byte, except that it spells
// the whole keys "." and ".." with %2E: a prefix of dots only is matched
// on the client.
func escapedPrefix(p string) string {
	if strings.Trim(p, ".") == "" {
		return ""
	}
	return backend.EscapeKey(p)
}

// leaseTTLs sets the TTL of each state from its holder's lease, ids[i],
// asking once per lease, a few at a time.
func (d *Driver) leaseTTLs(ctx context.Context, sts []backend.State, ids []clientv3.LeaseID) error {
	type ttl struct {
		st  backend.State
		err error
	}
	ttls := map[clientv3.LeaseID]*ttl{}
	for _, id := range ids {
		ttls[id] = &ttl{st: backend.State{Known: known}}
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for id, t := range ttls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t.err = d.leaseTTL(ctx, &t.st, id)
		})
	}
	wg.Wait()
	for i, id := range ids {
		t := ttls[id]
		if t.err != nil {
			return t.err
		}
		sts[i].TTL, sts[i].Known = t.st.TTL, t.st.Known
	}
	return nil
}

// Break implements backend.Breaker: it reads the holder's entry, the
// oldest in key's directory, and deletes it in a transaction that
// compares its creation revision with fence. The next holder's fence, the
// creation revision of an entry made after it, is above fence. The
// removed holder's driver finds the entry gone at its next check (see
// verify) and reports the lock lost.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	defer done()
	resp, err := d.get(ctx, d.Dir(key), clientv3.WithFirstCreate()...)
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", d.failed(ctx, err))
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != fence || fence == 0 {
		return backend.State{}, fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	kv := resp.Kvs[0]
	st := stateOf(key, resp.Kvs)
	st.Known &^= backend.KnowsWaiters | backend.KnowsQueue // not read
	if err := d.leaseTTL(ctx, &st, clientv3.LeaseID(kv.Lease)); err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", err)
	}
	tresp, ambiguous, err := d.txnRun(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(string(kv.Key)))
	})
	if err != nil {
		return backend.State{}, fmt.Errorf("etcdlock: %w", d.failed(ctx, err))
	}
	// After an attempt whose reply was lost, an entry found gone was most
	// likely deleted by that attempt.
	if !tresp.Succeeded && !ambiguous {
		return backend.State{}, fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	return st, nil
}
