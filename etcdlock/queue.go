package etcdlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockerhq/locker/backend"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"
)

var _ backend.Queuer = (*Driver)(nil)

// QueueModes implements backend.Queuer: every mode queues, its entries in
// creation revision order.
func (d *Driver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// ticket is one claim's entry in its queue. It keeps its lease in use (see
// useLease) until the claim holds the key, the entry is gone or it leaves.
type ticket struct {
	d         *Driver
	c         backend.Claim
	s         *slot
	over      string          // the entries that may be ahead of ours
	limit     int             // a semaphore's: how many may be; 0: one
	weight    int             // the permits the claim takes: 1 but for a weighted permit
	under     int             // the limit of the last look: the resized one, else limit
	resizeMod int64           // the resize key's modification revision then (0: none)
	rev       int64           // the entry's creation revision; 0 until confirmed
	older     map[string]int  // the entries ahead that it waits for, with their permits (nil: look)
	ahead     int             // the permits of older together
	checked   int64           // the revision older was read at
	broken    context.Context // ends when the connection goes down after the last request
	unsettled bool            // a put of the entry may still land (see putRun)
	mod       int64           // a delayed entry's modification revision once on its mark lease
}

// Enqueue implements backend.Queuer: one transaction puts c's entry at
// the back of its queue and reads what decides whether it waits.
func (d *Driver) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	dir, over, err := d.dirs(c)
	if err != nil {
		return backend.Grant{}, nil, fmt.Errorf("etcdlock: enqueue: %w", err)
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, nil, fmt.Errorf("etcdlock: enqueue: %w", err)
	}
	defer done()
	ls, m, err := d.session(ctx, nil, c.TTL, c.Delay)
	if err != nil {
		if !errors.Is(err, backend.ErrRequeue) {
			err = fmt.Errorf("lease: %w", d.gate.Failed(ctx, err))
		}
		return backend.Grant{}, nil, fmt.Errorf("etcdlock: enqueue: %w", err)
	}
	t := &ticket{d: d, c: c, s: d.alloc(ls, dir, m), over: over, weight: 1}
	if c.Mode == backend.Permit {
		t.limit, t.weight = c.Limit, max(c.Weight, 1)
	}
	g, err := t.put(ctx)
	g, err = t.after(ctx, "enqueue", g, err)
	switch {
	case err == nil:
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, t, nil
	case errors.Is(err, backend.ErrRequeue):
		return backend.Grant{}, nil, err
	}
	return backend.Grant{}, t, err
}

// Wait implements backend.Ticket: it waits for the deletion of the entries
// ahead (see await), then looks; a Wait after a failure looks at once.
func (t *ticket) Wait(ctx context.Context) (backend.Grant, error) {
	ctx, done, err := t.d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("etcdlock: wait: %w", err)
	}
	defer done()
	var g backend.Grant
	if t.older != nil {
		err = t.await(ctx)
		t.older = nil
	}
	switch {
	case err != nil:
	case t.rev == 0:
		g, err = t.put(ctx) // an earlier put went unanswered
	default:
		g, err = t.look(ctx)
	}
	return t.after(ctx, "wait", g, err)
}

// after ends t's use of its lease once its claim holds the key or its
// entry is gone, and wraps the error of op.
func (t *ticket) after(ctx context.Context, op string, g backend.Grant, err error) (backend.Grant, error) {
	switch {
	case err == nil:
		t.d.unuse(t.s.ls)
		return g, nil
	case errors.Is(err, backend.ErrRequeue):
		t.d.free(t.s)
		t.d.unuse(t.s.ls)
	case !errors.Is(err, backend.ErrNotAcquired):
		err = t.d.gate.Failed(ctx, err)
	}
	return backend.Grant{}, fmt.Errorf("etcdlock: %s: %w", op, err)
}

// Leave implements backend.Ticket: it deletes the entry, or leaves it to
// the sweep (etcd out of reach, or a put of it may still land).
func (t *ticket) Leave(ctx context.Context) error {
	defer t.d.unuse(t.s.ls)
	if t.unsettled {
		t.d.orphan(t.s, 0)
	} else {
		t.d.remove(ctx, t.s, t.rev)
	}
	return nil
}

// put puts t's entry, unless an unanswered attempt did, with the read
// that decides whether it waits.
func (t *ticket) put(ctx context.Context) (backend.Grant, error) {
	d, key := t.d, t.s.key
	val := t.c.Owner
	if t.limit > 0 {
		val = permitValue(t.limit, t.weight, t.c.Owner)
	}
	put := clientv3.OpPut(key, val, clientv3.WithLease(t.s.ls.id))
	if t.s.mark != nil {
		// On the mark lease if the queue is empty, so the claim holds the
		// key: etcd compares before it writes, nested transactions' too.
		put = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(t.over), "=", 0).WithPrefix()},
			[]clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(t.s.mark.id))}, []clientv3.Op{put})
	}
	t.broken = d.brokenConn()
	resp, err := d.putRun(ctx, nil, func(ctx context.Context) clientv3.Txn {
		d.tries.Add(1)
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(append([]clientv3.Op{put}, t.read(0)...)...).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly()))
	})
	switch {
	case isLeaseNotFound(err):
		d.loseLease(t.s.ls, "was not found by the server")
		return backend.Grant{}, backend.ErrRequeue
	case err != nil:
		t.unsettled = t.unsettled || errors.Is(err, errUnsettled)
		return backend.Grant{}, err
	case !resp.Succeeded:
		kv := resp.Responses[0].GetResponseRange().GetKvs()[0]
		t.rev = kv.CreateRevision
		if t.s.mark != nil && kv.Lease == int64(t.s.mark.id) {
			t.mod = kv.ModRevision
		}
		return t.look(ctx)
	}
	t.rev = resp.Header.Revision
	if r := resp.Responses[0].GetResponseTxn(); r != nil && r.Succeeded {
		t.mod = t.rev
	}
	return t.settle(ctx, resp.Responses[1:], t.rev)
}

// look checks, in one linearizable transaction, that t's entry is there,
// and reads the entries ahead of it.
func (t *ticket) look(ctx context.Context) (backend.Grant, error) {
	d := t.d
	t.broken = d.brokenConn()
	resp, _, err := d.txn(ctx, nil, func(ctx context.Context) clientv3.Txn {
		d.tries.Add(1)
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.s.key), "=", t.rev)).
			Then(t.read(t.rev - 1)...)
	})
	switch {
	case err != nil:
		return backend.Grant{}, err
	case !resp.Succeeded:
		return backend.Grant{}, backend.ErrRequeue
	}
	return t.settle(ctx, resp.Responses, resp.Header.Revision)
}

// read is the entries under over created at revision maxRev or before
// (0: any) that decide whether t waits: a semaphore's all, and its resize
// key; else the youngest two (in put's transaction, ours and the one just
// ahead). opts apply to each.
func (t *ticket) read(maxRev int64, opts ...clientv3.OpOption) []clientv3.Op {
	if t.limit > 0 {
		return []clientv3.Op{clientv3.OpGet(t.over, append(opts, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(maxRev))...),
			clientv3.OpGet(resizeKey(t.over), opts...)}
	}
	return []clientv3.Op{clientv3.OpGet(t.over, append(opts, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(maxRev),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))...)}
}

// settle takes the key for t's claim, or notes what it waits for, from
// rs, read at revision rev (see read): the youngest other entry, or, a
// semaphore's, every other while t's claim does not fit behind them (see
// admit).
func (t *ticket) settle(ctx context.Context, rs []*etcdserverpb.ResponseOp, rev int64) (backend.Grant, error) {
	var r record
	if t.limit > 0 {
		r = resized(rs[1].GetResponseRange().GetKvs())
		t.resizeMod = r.mod
	}
	// One of the resize record's holders holds whatever the limit.
	held := t.rev <= r.upto
	p := permits{r: r}
	older, ahead, oldest := map[string]int{}, 0, t.rev
	for _, kv := range rs[0].GetResponseRange().GetKvs() {
		k := string(kv.Key)
		if k == t.s.key || held {
			continue
		}
		if t.limit == 0 {
			older[k], ahead = 1, 1
			break
		}
		older[k] = p.add(kv)
		oldest = min(oldest, kv.CreateRevision)
	}
	if t.limit > 0 && !held {
		var err error
		if t.under, _, err = p.admit(t.limit, t.weight); err != nil {
			return backend.Grant{}, err
		}
		ahead = p.sum
	}
	t.d.forgetRemoved(ctx, t.over, r, oldest)
	t.older, t.ahead, t.checked = older, ahead, rev
	if held || !t.waits() {
		// Our entry was at the head of the queue in this read, our lease
		// alive: the key is ours. A delayed claim's entry moves to its
		// mark lease, unless put there.
		if t.s.mark != nil && t.mod == 0 {
			mod, err := t.d.toMark(ctx, t.s, t.rev)
			if err != nil {
				return backend.Grant{}, err
			}
			t.mod = mod
		}
		t.older = nil
		return t.d.grant(ctx, t.s, t.c, t.rev, max(t.mod, t.rev))
	}
	return backend.Grant{}, backend.ErrNotAcquired
}

// waits reports whether the entries ahead leave too few permits for t's
// claim (one, but for a semaphore's).
func (t *ticket) waits() bool { return t.ahead+t.weight > max(t.under, 1) }

// drop forgets the entry k ahead of t.
func (t *ticket) drop(k string) {
	t.ahead -= t.older[k]
	delete(t.older, k)
}

// errBroken: every connection to etcd went down while the claim waited.
var errBroken = errors.New("the connection to etcd went down")

// await blocks until t.older leave room for t's claim or a semaphore's
// resize key changes, ctx ends, the lease ends (ErrRequeue), or the
// connection goes down after t's last request (errBroken: the etcd client
// resumes a broken watch silently, however long it takes). It watches from
// the server's current revision, never an older one (see "Waiting" in
// docs/backends/etcdlock.md); blocked catches a change before that.
func (t *ticket) await(ctx context.Context) error {
	// Watch blocks until etcd confirms the watch, however long: it ends
	// when the connection or the lease goes.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	defer context.AfterFunc(t.broken, cancel)()
	defer context.AfterFunc(t.s.ls.done, cancel)()
	key, opts := t.watched()
	err := errors.New("the watch ended")
	for wr := range t.d.cli.Watch(wctx, key, append(opts, clientv3.WithCreatedNotify())...) {
		if wr.Err() != nil {
			err = fmt.Errorf("watch: %w", permission(wr.Err()))
			break
		}
		if wr.Created && wr.Header.Revision > t.checked && !t.blocked(ctx, wr.Header.Revision) {
			return nil
		}
		for _, ev := range wr.Events {
			switch k := string(ev.Kv.Key); {
			case t.limit > 0 && k == resizeKey(t.over):
				return nil // look again, under the limit now
			case ev.Type == clientv3.EventTypeDelete:
				t.drop(k)
			}
		}
		if !t.waits() {
			return nil
		}
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case t.s.ls.done.Err() != nil:
		return backend.ErrRequeue
	case t.broken.Err() != nil:
		return errBroken
	}
	return err
}

// watched is what t watches: the deletion of the entry just ahead (a put
// moves it to a mark lease), or every change of a semaphore's resize key
// and directory, one range (no other key is between them: see dirs).
func (t *ticket) watched() (string, []clientv3.OpOption) {
	if t.limit > 0 {
		return resizeKey(t.over), []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(t.over))}
	}
	var ahead string // the one entry a lock's or a read-write lock's claim waits for
	for ahead = range t.older {
		break
	}
	return ahead, []clientv3.OpOption{clientv3.WithFilterPut()}
}

// blocked drops from t.older the entries that a local read at revision
// rev or later no longer finds, and reports whether t still waits; false
// when it cannot tell, or a semaphore's resize key changed.
func (t *ticket) blocked(ctx context.Context, rev int64) bool {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	// Reads alone, all serializable: etcd serves them locally.
	resp, err := t.d.cli.Txn(ctx).Then(t.read(t.rev-1, clientv3.WithSerializable())...).Commit()
	if err != nil || resp.Header.Revision < rev {
		return false
	}
	if t.limit > 0 {
		if resized(resp.Responses[1].GetResponseRange().GetKvs()).mod != t.resizeMod {
			return false
		}
	}
	left := map[string]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		left[string(kv.Key)] = true
	}
	for k := range t.older {
		if !left[k] {
			t.drop(k)
		}
	}
	return t.waits()
}

// brokenConn returns a context that ends when every connection of the
// etcd client next goes down.
func (d *Driver) brokenConn() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broken
}

// watchConn ends d.broken, and makes a new one, each time the client's
// gRPC connection leaves the Ready state (no endpoint is reachable).
func (d *Driver) watchConn() {
	ctx := d.gate.Context()
	conn := d.cli.ActiveConnection()
	for {
		st := conn.GetState()
		if !conn.WaitForStateChange(ctx, st) {
			return
		}
		if st == connectivity.Ready {
			d.mu.Lock()
			d.breaks()
			d.broken, d.breaks = context.WithCancel(context.Background())
			d.mu.Unlock()
		}
	}
}
