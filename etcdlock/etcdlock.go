// Package etcdlock is the etcd backend of package locker: leases, a fair
// queue in creation-revision order, and watches instead of polling.
//
// Import it for its side effect to make locker.Open accept etcd URLs:
//
//	import _ "github.com/lockerhq/locker/etcdlock"
//
//	c, err := locker.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks")
//
// or build the driver from a client you already have:
//
//	c, err := locker.New(etcdlock.New(cli, etcdlock.WithPrefix("/locks")))
//
// # How locks are stored
//
// A lock on key k is a queue: the directory <prefix>/<backend.EscapeKey(k)>/.
// Every acquisition puts one entry there, named after a hash of its secret
// token (never the token itself) and attached to its client's lease. The
// entry with the lowest creation revision holds the lock; the others wait,
// each watching only the entry just ahead of it. The escaped key contains no
// '/', so the queues of names such as "a" and "a/b" never overlap.
//
// A try-acquire writes its entry only if the directory is empty (one
// transaction, a range comparison), so a failed try leaves nothing behind.
// The fencing token is the creation revision of the holder's entry: etcd
// revisions only grow, and a waiter is granted the lock only when no entry
// older than its own is left, so fences grow in grant order. Release is a
// transaction that deletes the entry only if its creation revision is still
// the fence.
//
// # Sessions
//
// A driver keeps one lease per effective TTL (in practice one per client: a
// Client uses one default TTL), shared by all its locks and waiters, and
// sends it a keep-alive every TTL/3. The lease's TTL is whole seconds, at
// least the server's minimum (etcd raises shorter ones, by default to about
// 2s; the granted TTL is what Grant.TTL reports). When the server says the
// lease is gone (revoked, expired), or no keep-alive succeeded for a whole
// TTL, every lock on the lease reports its loss through Lock.OnLost. Every
// TTL/3 the driver also checks that the entries of its held locks still
// exist, so that an entry deleted by hand is reported lost too.
package etcdlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrefix is the etcd key prefix of locks when none is given.
const DefaultPrefix = "/locker"

// maxLeaseTTL is etcd's largest lease TTL, in seconds (MaxLeaseTTL).
const maxLeaseTTL = 9_000_000_000

// idleLease is how long a lease with no lock and no waiter is kept, for the
// next acquisition, before it is revoked.
const idleLease = time.Minute

// opTimeout bounds the clean-up requests the driver makes on its own behalf
// (deleting a cancelled waiter's entry, revoking leases on Close).
const opTimeout = 5 * time.Second

// Option configures a driver made by New.
type Option func(*Driver)

// WithPrefix sets the etcd key prefix under which locks live (default
// DefaultPrefix). Drivers that should see each other's locks must use the
// same prefix.
func WithPrefix(prefix string) Option {
	return func(d *Driver) { d.prefix = cleanPrefix(prefix) }
}

func cleanPrefix(p string) string {
	p = strings.TrimRight(p, "/")
	if p == "" {
		return DefaultPrefix
	}
	return p
}

// Driver is the etcd driver. It implements backend.Driver, backend.Waiter
// and backend.Session.
type Driver struct {
	cli    *clientv3.Client
	owned  bool // opened by the driver: Close closes it
	prefix string

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	bg     sync.WaitGroup // the driver's goroutines
	ops    sync.WaitGroup // calls in flight

	mu      sync.Mutex
	closed  bool
	leases  map[int64]*lease  // live leases by granted TTL in seconds
	minTTL  int64             // the server's minimum lease TTL, once learned
	held    map[string]*entry // held locks by etcd key
	orphans map[string]int64  // entries to delete: etcd key → creation revision (0: any)
}

var (
	_ backend.Driver  = (*Driver)(nil)
	_ backend.Waiter  = (*Driver)(nil)
	_ backend.Session = (*Driver)(nil)
)

// entry is a held lock.
type entry struct {
	key    string // etcd key
	rev    int64  // its creation revision: the fence
	ls     *lease
	onLost func(error)
}

// New returns a driver that uses cli, a client the caller built and keeps
// owning: Close revokes the driver's leases (freeing its locks) but does not
// close cli.
func New(cli *clientv3.Client, opts ...Option) *Driver {
	return newDriver(cli, false, opts...)
}

func newDriver(cli *clientv3.Client, owned bool, opts ...Option) *Driver {
	d := &Driver{
		cli:     cli,
		owned:   owned,
		prefix:  DefaultPrefix,
		leases:  map[int64]*lease{},
		held:    map[string]*entry{},
		orphans: map[string]int64{},
	}
	for _, o := range opts {
		o(d)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d
}

// Client returns the etcd client the driver uses.
func (d *Driver) Client() *clientv3.Client { return d.cli }

// Prefix returns the key prefix under which the driver's locks live.
func (d *Driver) Prefix() string { return d.prefix }

// Dir returns the etcd key prefix of the queue of key (with a trailing '/'):
// every entry of the lock, holder's and waiters', is directly under it.
func (d *Driver) Dir(key string) string {
	return d.prefix + "/" + backend.EscapeKey(key) + "/"
}

// entryKey is the etcd key of token's entry in the queue of key: a hash, so
// that listing the queue does not show tokens.
func (d *Driver) entryKey(l backend.Lock) string {
	sum := sha256.Sum256([]byte(l.Token))
	return d.Dir(l.Key) + hex.EncodeToString(sum[:8])
}

// SessionTTL returns the TTL of the driver's session lease: the default-TTL
// lease if one was granted, otherwise the server's minimum once learned, or
// zero. Each lock's own effective TTL is in its Grant.
func (d *Driver) SessionTTL() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best time.Duration
	for _, ls := range d.leases {
		if best == 0 || ls.ttl < best {
			best = ls.ttl
		}
	}
	if best == 0 {
		best = time.Duration(d.minTTL) * time.Second
	}
	return best
}

// ttlSeconds turns a TTL into whole lease seconds, rounded up.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("%w: %v (want more than 0)", backend.ErrInvalidTTL, ttl)
	}
	sec := int64((ttl + time.Second - 1) / time.Second)
	if sec > maxLeaseTTL {
		return 0, fmt.Errorf("%w: %v is more than etcd's longest lease (%ds)", backend.ErrInvalidTTL, ttl, int64(maxLeaseTTL))
	}
	return sec, nil
}

// begin registers a call in flight; the returned context also ends when the
// driver closes.
func (d *Driver) begin(ctx context.Context) (context.Context, func(), error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, nil, backend.ErrClosed
	}
	d.ops.Add(1)
	d.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.ctx, cancel)
	return ctx, func() { stop(); cancel(); d.ops.Done() }, nil
}

// ctxErr explains why an operation under ctx stopped: the driver closed, or
// ctx's own reason.
func (d *Driver) ctxErr(ctx context.Context) error {
	if d.ctx.Err() != nil {
		return backend.ErrClosed
	}
	return context.Cause(ctx)
}

// TryAcquire takes l.Key if its queue is empty, in one transaction that
// writes nothing when the lock is held or has waiters.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Lock) (backend.Grant, error) {
	return d.acquire(ctx, l, false)
}

// Acquire queues for l.Key and waits, watching the entry just ahead, until
// every older entry is gone. On error it deletes its entry.
func (d *Driver) Acquire(ctx context.Context, l backend.Lock) (backend.Grant, error) {
	return d.acquire(ctx, l, true)
}

func (d *Driver) acquire(ctx context.Context, l backend.Lock, wait bool) (backend.Grant, error) {
	op := "try-acquire"
	if wait {
		op = "acquire"
	}
	if _, err := ttlSeconds(l.TTL); err != nil {
		return backend.Grant{}, fmt.Errorf("etcdlock: %s: %w", op, err)
	}
	ctx, end, err := d.begin(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("etcdlock: %s: %w", op, err)
	}
	defer end()
	key := d.entryKey(l)
	for attempt := 0; ; attempt++ {
		ls, err := d.useLease(ctx, l.TTL)
		if err != nil {
			if ctx.Err() != nil {
				err = d.ctxErr(ctx)
			}
			return backend.Grant{}, fmt.Errorf("etcdlock: %s: lease: %w", op, err)
		}
		var g backend.Grant
		if wait {
			g, err = d.enqueue(ctx, ls, l, key)
		} else {
			g, err = d.try(ctx, ls, l, key)
		}
		d.unuse(ls)
		if errors.Is(err, errRequeue) && attempt < 5 {
			// Our lease (or our entry) vanished while we queued: start
			// over, at the back, with a live lease.
			continue
		}
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, backend.ErrNotAcquired) {
				err = fmt.Errorf("%w: %w", backend.ErrNotAcquired, d.ctxErr(ctx))
			}
			return backend.Grant{}, fmt.Errorf("etcdlock: %s: %w", op, err)
		}
		return g, nil
	}
}

// errRequeue: the entry we queued is gone (its lease expired or was revoked,
// or it was deleted by hand) before we got the lock.
var errRequeue = errors.New("entry lost while queued")

func (d *Driver) try(ctx context.Context, ls *lease, l backend.Lock, key string) (backend.Grant, error) {
	dir := d.Dir(l.Key)
	resp, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(key, l.Owner, clientv3.WithLease(ls.id))).
			Else(clientv3.OpGet(dir, clientv3.WithFirstCreate()...))
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, ls, key, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 || string(kvs[0].Key) != key {
			return backend.Grant{}, backend.ErrNotAcquired
		}
		// An earlier attempt of ours was applied although its reply was lost.
		rev = kvs[0].CreateRevision
	}
	return d.grant(ctx, ls, l, key, rev)
}

// failedPut handles an error from a transaction that may have written key:
// a lost lease means start over; anything else may have been applied, so the
// entry is deleted (or left to the background sweep).
func (d *Driver) failedPut(ctx context.Context, ls *lease, key string, err error) error {
	if isLeaseNotFound(err) {
		d.loseLease(ls, "was not found by the server")
		return errRequeue
	}
	d.remove(ctx, key, 0)
	return err
}

// grant records a held lock, unless its lease was lost meanwhile.
func (d *Driver) grant(ctx context.Context, ls *lease, l backend.Lock, key string, rev int64) (backend.Grant, error) {
	d.mu.Lock()
	if ls.err != nil {
		d.mu.Unlock()
		d.remove(ctx, key, rev)
		return backend.Grant{}, errRequeue
	}
	e := &entry{key: key, rev: rev, ls: ls, onLost: l.OnLost}
	if old := d.held[key]; old != nil && old.ls != nil {
		delete(old.ls.entries, old)
	}
	d.held[key] = e
	ls.entries[e] = struct{}{}
	d.mu.Unlock()
	return backend.Grant{Fence: uint64(rev), TTL: ls.ttl}, nil
}

// remove deletes a waiter's or a failed acquisition's entry, even when ctx
// is done. rev 0 deletes the key whatever its revision (it is named after a
// token that no one else has). When etcd cannot be reached, the background
// sweep keeps trying for as long as the lease may keep the entry alive.
func (d *Driver) remove(ctx context.Context, key string, rev int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := d.deleteEntry(ctx, key, rev); err != nil {
		d.mu.Lock()
		d.orphans[key] = rev
		d.mu.Unlock()
	}
}

func (d *Driver) deleteEntry(ctx context.Context, key string, rev int64) error {
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	}
	_, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(cmp).Then(clientv3.OpDelete(key))
	})
	return err
}

// Refresh checks that l's entry still exists with its creation revision,
// and sends its lease a keep-alive.
func (d *Driver) Refresh(ctx context.Context, l backend.Lock) error {
	ctx, end, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: refresh: %w", err)
	}
	defer end()
	key := d.entryKey(l)
	resp, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(holds(key, l.Fence)).Then(clientv3.OpGet(key, clientv3.WithKeysOnly()))
	})
	if err != nil {
		return fmt.Errorf("etcdlock: refresh: %w", err)
	}
	kvs := resp.Responses
	if !resp.Succeeded || len(kvs) == 0 || len(kvs[0].GetResponseRange().GetKvs()) == 0 {
		d.forget(key)
		return fmt.Errorf("etcdlock: refresh: %w", backend.ErrNotHeld)
	}
	id := clientv3.LeaseID(kvs[0].GetResponseRange().GetKvs()[0].Lease)
	if id == clientv3.NoLease {
		return nil
	}
	start := time.Now()
	ka, err := d.cli.KeepAliveOnce(ctx, id)
	switch {
	case isLeaseNotFound(err):
		if ls := d.leaseByID(id); ls != nil {
			d.loseLease(ls, "was not found by the server")
		}
		d.forget(key)
		return fmt.Errorf("etcdlock: refresh: %w: its lease expired", backend.ErrNotHeld)
	case err != nil:
		return fmt.Errorf("etcdlock: refresh: keep-alive: %w", err)
	}
	if ls := d.leaseByID(id); ls != nil {
		d.renewed(ls, start, ka.TTL)
	}
	return nil
}

// holds compares key's creation revision with fence, or, without a fence,
// checks that key exists.
func holds(key string, fence uint64) clientv3.Cmp {
	if fence == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", int64(fence))
}

// Release deletes l's entry if its creation revision is still l.Fence, so a
// retried release never deletes a newer lock.
func (d *Driver) Release(ctx context.Context, l backend.Lock) error {
	ctx, end, err := d.begin(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: release: %w", err)
	}
	defer end()
	key := d.entryKey(l)
	d.forget(key)
	var ambiguous bool
	resp, err := d.txnAttempts(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(holds(key, l.Fence)).Then(clientv3.OpDelete(key))
	}, &ambiguous)
	if err != nil {
		if l.Fence != 0 {
			d.mu.Lock()
			d.orphans[key] = int64(l.Fence)
			d.mu.Unlock()
		}
		return fmt.Errorf("etcdlock: release: %w (the driver keeps trying in the background)", err)
	}
	if !resp.Succeeded && !ambiguous {
		return fmt.Errorf("etcdlock: release: %w", backend.ErrNotHeld)
	}
	// After an attempt whose reply was lost, an entry found gone was most
	// likely deleted by that attempt.
	return nil
}

// forget drops a held lock from the driver's books: no loss is reported
// for it any more.
func (d *Driver) forget(key string) {
	d.mu.Lock()
	if e := d.held[key]; e != nil {
		delete(d.held, key)
		delete(e.ls.entries, e)
		if len(e.ls.entries) == 0 && e.ls.users == 0 {
			e.ls.idleSince = time.Now()
		}
	}
	d.mu.Unlock()
}

// Close stops the driver's goroutines and revokes its leases, which frees
// every lock and queue entry it still has, then closes the etcd client if
// the driver opened it.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("etcdlock: close: %w", backend.ErrClosed)
	}
	d.closed = true
	var leases []*lease
	for _, ls := range d.leases {
		leases = append(leases, ls)
	}
	d.leases = map[int64]*lease{}
	d.mu.Unlock()

	d.cancel()
	d.ops.Wait()
	d.bg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var errs []error
	for _, ls := range leases {
		d.mu.Lock()
		ls.end(fmt.Errorf("etcdlock: %w", backend.ErrClosed))
		d.mu.Unlock()
		if _, err := d.cli.Revoke(ctx, ls.id); err != nil && !isLeaseNotFound(err) {
			errs = append(errs, fmt.Errorf("etcdlock: close: revoke lease %x: %w", int64(ls.id), err))
		}
	}
	if d.owned {
		if err := d.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("etcdlock: close: %w", err))
		}
	}
	return errors.Join(errs...)
}
