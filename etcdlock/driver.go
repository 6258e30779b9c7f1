package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrefix is the etcd key prefix of locks when none is given.
const DefaultPrefix = "/locker"

// maxLeaseTTL is etcd's largest lease TTL, in seconds (MaxLeaseTTL).
const maxLeaseTTL = 9_000_000_000

// idleLease is how long a lease with no lock and no waiter is kept for the
// next acquisition.
const idleLease = time.Minute

// opTimeout bounds the driver's own clean-up requests.
const opTimeout = 5 * time.Second

// closeRevokeTimeout bounds the lease revocations of Close.
const closeRevokeTimeout = time.Second

// Driver is the etcd driver. It implements backend.Driver, backend.Queuer,
// backend.Session and backend.Delayer.
type Driver struct {
	cli    *clientv3.Client
	owned  bool // opened by the driver: Close closes it
	prefix string

	gate backend.Gate   // calls in flight, and Close
	bg   sync.WaitGroup // the driver's goroutines

	mu      sync.Mutex
	broken  context.Context    // ends when every connection to etcd next goes down
	breaks  func()             // ends broken
	leases  map[int64]*lease   // live leases by granted TTL in seconds
	minTTL  int64              // the server's minimum lease TTL, once learned
	lastTTL time.Duration      // the TTL of the latest lease granted
	held    map[holdKey]*entry // held locks
	orphans map[*slot]int64    // entries to delete → creation revision (0: any)

	tries atomic.Uint64 // requests a blocking acquisition sent that could grant it

	cut *cutter // bounds each attempt of a request
}

// holdKey is a held lock's key in Driver.held: a key's lock, semaphore
// and read-write lock are apart there too.
type holdKey struct {
	key, token string
	obj        backend.Mode
}

func holdKeyOf(l backend.Claim) holdKey { return holdKey{l.Key, l.Token, backend.Object(l.Mode)} }

var (
	_ backend.Driver  = (*Driver)(nil)
	_ backend.Session = (*Driver)(nil)
)

// entry is a held lock.
type entry struct {
	hk     holdKey
	s      *slot
	rev    int64 // its creation revision: the fence
	mod    int64 // its modification revision: rev, or its move to a mark lease
	onLost func(error)
}

// slot is the key of one acquisition's entry, reserved in its lease until
// the entry is known gone from the store.
type slot struct {
	ls   *lease
	dir  string
	n    int
	key  string
	mark *mark // the lease of the entry, if its claim has a delay
	// spent: a delete of key that matches any entry there may still land
	// (an attempt unanswered, sent again or given up), so key is never
	// given to another acquisition of its lease: that delete would free
	// its lock, the holder untold.
	spent bool
}

// New returns a driver that uses cli, a client the caller built and keeps
// owning: Close revokes the driver's leases (freeing its locks) but does not
// close cli. A nil cli is an error.
func New(cli *clientv3.Client, opts ...Option) (*Driver, error) {
	if cli == nil {
		return nil, fmt.Errorf("etcdlock: New: %w: nil client", backend.ErrInvalidOption)
	}
	return newDriver(cli, false, newConfig(opts)), nil
}

func newDriver(cli *clientv3.Client, owned bool, cfg config) *Driver {
	d := &Driver{
		cli:     cli,
		owned:   owned,
		prefix:  cfg.prefix,
		leases:  map[int64]*lease{},
		held:    map[holdKey]*entry{},
		orphans: map[*slot]int64{},
		cut:     newCutter(),
	}
	d.broken, d.breaks = context.WithCancel(context.Background())
	d.bg.Go(d.watchConn)
	d.bg.Go(d.keepStream)
	d.bg.Go(func() { d.cut.run(d.gate.Context()) })
	return d
}

// Client returns the etcd client the driver uses.
func (d *Driver) Client() *clientv3.Client { return d.cli }

// Prefix returns the key prefix under which the driver's locks live.
func (d *Driver) Prefix() string { return d.prefix }

// Dir returns the etcd key prefix of the queue of key (with a trailing '/'):
// every entry of the lock, holder's and waiters', is directly under it.
func (d *Driver) Dir(key string) string {
	return d.dir(key, "")
}

// alloc reserves the lowest free slot of ls in dir.
func (d *Driver) alloc(ls *lease, dir string, m *mark) *slot {
	d.mu.Lock()
	defer d.mu.Unlock()
	used := ls.slots[dir]
	if used == nil {
		used = map[int]bool{}
		ls.slots[dir] = used
	}
	n := 0
	for used[n] {
		n++
	}
	used[n] = true
	return &slot{ls: ls, dir: dir, n: n, key: dir + strconv.FormatInt(int64(ls.id), 16) + "-" + strconv.Itoa(n), mark: m}
}

// free gives a slot back: its entry is gone from the store.
func (d *Driver) free(s *slot) {
	d.mu.Lock()
	d.freeLocked(s)
	d.mu.Unlock()
}

func (d *Driver) freeLocked(s *slot) {
	if m := s.mark; m != nil {
		if m.n--; m.n == 0 {
			m.idleSince = time.Now()
		}
		s.mark = nil // once, for a slot freed twice
	}
	if used := s.ls.slots[s.dir]; used != nil && !s.spent {
		delete(used, s.n)
		if len(used) == 0 {
			delete(s.ls.slots, s.dir)
		}
	}
}

// SessionTTL returns the shortest TTL of the driver's live leases, else
// the latest granted, else the server's minimum once learned, or zero.
// Each lock's own is in its Grant.
func (d *Driver) SessionTTL() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best time.Duration
	for _, ls := range d.leases {
		if best == 0 || ls.ttl < best {
			best = ls.ttl
		}
	}
	return cmp.Or(best, d.lastTTL, time.Duration(d.minTTL)*time.Second)
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

// permission marks the server's refusal of our credentials or of an
// operation as backend.ErrPermission, which waiting cannot fix.
func permission(err error) error {
	switch rpctypes.Error(err) {
	case rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty,
		rpctypes.ErrInvalidAuthToken, rpctypes.ErrInvalidAuthMgmt:
		return fmt.Errorf("%w: %w", backend.ErrPermission, err)
	}
	return err
}

// TryAcquire takes l.Key if its queue is empty, in one transaction that
// writes nothing when the lock is held or has waiters.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	gs, err := d.tryAcquire(ctx, []backend.Claim{l})
	if err != nil {
		return backend.Grant{}, err
	}
	return gs[0], nil
}

// tryAcquire takes claims, one or a set of the same TTL and no delay
// (see TryAcquireAll), on one lease; again with a live lease, up to 5
// times, when the lease vanished meanwhile (ErrRequeue).
func (d *Driver) tryAcquire(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	dirs := make([]string, len(claims))
	overs := make([]string, len(claims))
	for i, l := range claims {
		var err error
		if dirs[i], overs[i], err = d.dirs(l); err != nil {
			return nil, fmt.Errorf("etcdlock: try-acquire: %w", err)
		}
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: try-acquire: %w", err)
	}
	defer done()
	l := claims[0]
	// One run of store failures for the whole call, across its requests.
	var run retry.Failing
	for requeues := 0; ; requeues++ {
		ls, m, err := d.session(ctx, &run, l.TTL, l.Delay)
		if err != nil {
			if errors.Is(err, backend.ErrRequeue) && requeues < 5 {
				continue
			}
			return nil, fmt.Errorf("etcdlock: try-acquire: lease: %w", d.gate.Failed(ctx, err))
		}
		ss := make([]*slot, len(claims))
		for i := range claims {
			ss[i] = d.alloc(ls, dirs[i], m)
		}
		var gs []backend.Grant
		if l.Mode == backend.Permit {
			var g backend.Grant
			g, err = d.tryPermit(ctx, &run, ss[0], l)
			gs = []backend.Grant{g}
		} else {
			gs, err = d.trySet(ctx, &run, ss, claims, overs)
		}
		d.unuse(ls)
		if errors.Is(err, backend.ErrRequeue) && requeues < 5 {
			continue // our lease vanished: again, with a live one
		}
		if err != nil {
			if !errors.Is(err, backend.ErrNotAcquired) {
				err = d.gate.Failed(ctx, err)
			}
			return nil, fmt.Errorf("etcdlock: try-acquire: %w", err)
		}
		return gs, nil
	}
}

// session returns a live lease for ttl, in use until unuse, and for a
// delay its mark lease (see useLease and useMark).
func (d *Driver) session(ctx context.Context, run *retry.Failing, ttl, delay time.Duration) (*lease, *mark, error) {
	ls, err := d.useLease(ctx, run, ttl)
	if err != nil || delay == 0 {
		return ls, nil, err
	}
	m, err := d.useMark(ctx, run, ls, delay)
	if err != nil {
		d.unuse(ls)
		return nil, nil, err
	}
	return ls, m, nil
}

// failedPut handles an error from a transaction that may have written s's
// key: a lost lease means start over; anything else may have been applied,
// so the entry is deleted, or, etcd out of reach or unanswered after its
// caller gave up (errUnsettled), left to the sweep at the next keep-alive
// that gets through, or to its lease.
func (d *Driver) failedPut(ctx context.Context, s *slot, err error) error {
	switch {
	case isLeaseNotFound(err):
		d.loseLease(s.ls, "was not found by the server")
		return backend.ErrRequeue
	case resendable(err) || errors.Is(err, errUnsettled):
		d.orphan(s, 0)
	default:
		d.remove(ctx, s, 0)
	}
	return err
}

// orphan leaves s's entry, of creation revision rev (0: any), to the
// background sweep.
func (d *Driver) orphan(s *slot, rev int64) {
	d.mu.Lock()
	d.orphans[s] = rev
	d.mu.Unlock()
}

// grant records a held lock, of creation revision rev and modification
// revision mod, unless its lease was lost meanwhile.
func (d *Driver) grant(ctx context.Context, s *slot, l backend.Claim, rev, mod int64) (backend.Grant, error) {
	d.mu.Lock()
	if s.ls.err != nil {
		d.mu.Unlock()
		d.remove(ctx, s, rev)
		return backend.Grant{}, backend.ErrRequeue
	}
	hk := holdKeyOf(l)
	e := &entry{hk: hk, s: s, rev: rev, mod: mod, onLost: l.OnLost}
	if old := d.held[hk]; old != nil {
		delete(old.s.ls.entries, old) // a token used twice: the caller's bug
	}
	d.held[hk] = e
	s.ls.entries[e] = struct{}{}
	d.mu.Unlock()
	return backend.Grant{Fence: uint64(rev), TTL: s.ls.ttl, Contact: d.contact(s.ls), SessionTTL: s.ls.ttl}, nil
}

// remove deletes a waiter's or a failed acquisition's entry, even when ctx
// is done, and frees its slot; rev 0: whatever its revision (the slot is
// ours). When etcd cannot be reached, the sweep keeps trying, the slot
// reserved until then.
func (d *Driver) remove(ctx context.Context, s *slot, rev int64) {
	timeout := opTimeout
	if ctx.Err() != nil {
		// The caller gave up: a store that answers gets one round trip,
		// one that does not is left to the sweep.
		timeout = backend.CancelGrace
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	_, ambiguous, err := d.deleteEntry(ctx, s.key, rev)
	if rev == 0 && (ambiguous || err != nil) {
		d.spend(s)
	}
	if err != nil {
		d.orphan(s, rev)
		return
	}
	d.free(s)
}

// spend marks s spent (see slot).
func (d *Driver) spend(s *slot) {
	d.mu.Lock()
	s.spent = true
	d.mu.Unlock()
}

// deleteEntry deletes key if its creation revision is rev (0: any), and
// reports whether an attempt that failed may have been applied (see txn).
func (d *Driver) deleteEntry(ctx context.Context, key string, rev int64) (*clientv3.TxnResponse, bool, error) {
	cond := clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	if rev == 0 {
		cond = clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	}
	return d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(cond).Then(clientv3.OpDelete(key))
	})
}

// Refresh checks that l's entry is unmodified since its creation or its
// move to a mark lease (a later revision is someone else's put), and
// renews its leases.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	ctx, end, e, err := d.heldEntry(ctx, l)
	if err != nil {
		return err
	}
	defer end()
	resp, _, err := d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
		// The Get is not decoration: etcd serves a transaction without
		// operations as a serializable read, from a member that may lag.
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.s.key), "=", e.mod)).
			Then(clientv3.OpGet(e.s.key, clientv3.WithCountOnly()))
	})
	if err != nil {
		return fmt.Errorf("etcdlock: %w", err)
	}
	if !resp.Succeeded {
		d.dropChanged(e)
		return fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	switch err := d.renew(ctx, e.s.ls); {
	case isLeaseNotFound(err):
		d.loseLease(e.s.ls, "was not found by the server")
		return fmt.Errorf("etcdlock: %w: its lease expired", backend.ErrNotHeld)
	case err != nil:
		return fmt.Errorf("etcdlock: keep-alive: %w", err)
	}
	return nil
}

// heldEntry enters the gate for a call on l and finds l's held entry
// (see lookup); end leaves the gate.
func (d *Driver) heldEntry(ctx context.Context, l backend.Claim) (context.Context, func(), *entry, error) {
	ctx, end, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("etcdlock: %w", err)
	}
	e, err := d.lookup(l)
	if err != nil {
		end()
		return nil, nil, nil, err
	}
	return ctx, end, e, nil
}

// lookup finds l's held entry, under l's fence.
func (d *Driver) lookup(l backend.Claim) (*entry, error) {
	d.mu.Lock()
	e := d.held[holdKeyOf(l)]
	d.mu.Unlock()
	if e == nil || (l.Fence != 0 && l.Fence != uint64(e.rev)) {
		return nil, fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	return e, nil
}

// Release deletes l's entry, as ReleaseAll.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	return d.ReleaseAll(ctx, []backend.Claim{l})[0]
}

// forget drops a held lock from the driver's books, so that no loss is
// reported for it any more, and reports whether e was still on them.
func (d *Driver) forget(e *entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held[e.hk] != e {
		return false
	}
	delete(d.held, e.hk)
	ls := e.s.ls
	delete(ls.entries, e)
	if len(ls.entries) == 0 && ls.users == 0 {
		ls.idleSince = time.Now()
	}
	return true
}

// Close stops the driver's goroutines and revokes its leases, freeing its
// locks and queue entries, then closes the etcd client if it opened it.
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("etcdlock: close: %w", backend.ErrClosed)
	}
	// No call is in flight any more, so no lease is being granted.
	d.mu.Lock()
	leases := slices.Collect(maps.Values(d.leases))
	d.leases = map[int64]*lease{}
	d.mu.Unlock()
	d.bg.Wait()
	var ids []clientv3.LeaseID
	for _, ls := range leases {
		d.mu.Lock()
		d.endLocked(ls, fmt.Errorf("etcdlock: %w", backend.ErrClosed))
		d.mu.Unlock()
		// Mark leases too: closing is no loss, and keeps no delay.
		ids = append(append(ids, ls.id), d.takeMarks(ls)...)
	}
	// Revoking frees the locks at once; unrevoked, they expire with their
	// leases. So Close waits for it at most closeRevokeTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), closeRevokeTimeout)
	defer cancel()
	errs := parallel.Each(len(ids), len(ids), func(i int) error {
		if _, err := d.cli.Revoke(ctx, ids[i]); err != nil && !isLeaseNotFound(err) {
			return fmt.Errorf("etcdlock: close: revoke lease %x: %w", int64(ids[i]), err)
		}
		return nil
	})
	if d.owned {
		if err := d.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("etcdlock: close: %w", err))
		}
	}
	return errors.Join(errs...)
}
