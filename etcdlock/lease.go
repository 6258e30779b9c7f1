package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lease is one session: an etcd lease kept alive by its own goroutine, with
// the locks that hang on it. Its fields are guarded by the driver's mutex.
type lease struct {
	id  clientv3.LeaseID
	sec int64         // granted TTL in seconds: the key in Driver.leases
	ttl time.Duration // granted TTL

	until     time.Time // the server keeps the lease at least until then
	users     int       // acquisitions in progress on it
	entries   map[*entry]struct{}
	slots     map[string]map[int]bool // by queue directory: slots in use
	idleSince time.Time               // when it last had no user and no entry
	marks     map[int64]*mark         // by delay in seconds: its mark leases

	done context.Context // ends when the lease does (endLocked, by stop)
	stop func()
	err  error // why it ended; set once, as done ends
}

// endLocked marks ls gone, once, and takes it off d.leases.
func (d *Driver) endLocked(ls *lease, err error) bool {
	if ls.err != nil {
		return false
	}
	ls.err = err
	ls.stop()
	if d.leases[ls.sec] == ls {
		delete(d.leases, ls.sec)
	}
	return true
}

// useLease returns a live lease for ttl, granted if needed (again while
// run lasts), in use until unuse.
func (d *Driver) useLease(ctx context.Context, run *retry.Failing, ttl time.Duration) (*lease, error) {
	sec, err := ttlSeconds(ttl)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.gate.Closed() {
		d.mu.Unlock()
		return nil, backend.ErrClosed
	}
	sec = max(sec, d.minTTL)
	if ls := d.leases[sec]; ls != nil {
		ls.users++
		d.mu.Unlock()
		return ls, nil
	}
	d.mu.Unlock()

	resp, start, err := d.grantLease(ctx, run, sec)
	if err != nil {
		return nil, err
	}
	ls := &lease{
		id:      resp.ID,
		sec:     resp.TTL,
		ttl:     time.Duration(resp.TTL) * time.Second,
		until:   start.Add(time.Duration(resp.TTL) * time.Second),
		entries: map[*entry]struct{}{},
		slots:   map[string]map[int]bool{},
		marks:   map[int64]*mark{},
	}
	ls.done, ls.stop = context.WithCancel(context.Background())
	d.mu.Lock()
	if resp.TTL > sec && resp.TTL > d.minTTL {
		d.minTTL = resp.TTL // the server raised it: that is its minimum
	}
	if d.gate.Closed() {
		d.mu.Unlock()
		d.revokeLater(resp.ID)
		return nil, backend.ErrClosed
	}
	if other := d.leases[ls.sec]; other != nil {
		// A concurrent acquisition granted one first: share it.
		other.users++
		d.mu.Unlock()
		d.revokeLater(resp.ID)
		return other, nil
	}
	ls.users++
	d.leases[ls.sec] = ls
	d.lastTTL = ls.ttl
	d.mu.Unlock()
	d.bg.Go(func() { d.keepAlive(ls) }) // inside the gate: Close waits for the calls before bg
	return ls, nil
}

// grantLease grants a lease of sec seconds or more, and returns when the
// request that got it was sent.
func (d *Driver) grantLease(ctx context.Context, run *retry.Failing, sec int64) (resp *clientv3.LeaseGrantResponse, start time.Time, err error) {
	// A grant sent again after a lost reply may leave a lease nobody
	// uses: with no key and no keep-alive, it expires on its own.
	_, err = d.resend(ctx, run, func(ctx context.Context) (err error) {
		start = time.Now()
		resp, err = d.cli.Grant(ctx, sec)
		return err
	})
	if err != nil {
		return nil, start, err
	}
	if resp.TTL < sec {
		// Never pretend: we could not report its TTLs.
		d.revokeLater(resp.ID)
		return nil, start, fmt.Errorf("%w: etcd granted a %ds lease for %ds", backend.ErrInvalidTTL, resp.TTL, sec)
	}
	return resp, start, nil
}

// unuse ends an acquisition's use of ls.
func (d *Driver) unuse(ls *lease) {
	d.mu.Lock()
	ls.users--
	if ls.users == 0 && len(ls.entries) == 0 {
		ls.idleSince = time.Now()
	}
	d.mu.Unlock()
}

// contact is backend.Grant.Contact for the locks on ls: when the latest
// answered request that renewed ls (its grant or a keep-alive) was sent;
// zero once ls is lost. Puts and reads of its keys do not renew it.
func (d *Driver) contact(ls *lease) func() time.Time {
	return func() time.Time {
		d.mu.Lock()
		defer d.mu.Unlock()
		if ls.err != nil {
			return time.Time{}
		}
		return ls.until.Add(-ls.ttl)
	}
}

// renew sends ls's mark leases, then ls, a keep-alive (the marks first: a
// session renewed alone could outlive them), and records when the one
// that renewed ls was sent.
func (d *Driver) renew(ctx context.Context, ls *lease) error {
	start := time.Now()
	if err := d.keepMarks(ctx, ls); err != nil {
		return err
	}
	ka, err := d.cli.KeepAliveOnce(ctx, ls.id)
	if err != nil {
		return err
	}
	until := start.Add(time.Duration(ka.TTL) * time.Second)
	d.mu.Lock()
	if until.After(ls.until) {
		ls.until = until
	}
	d.mu.Unlock()
	return nil
}

// loseLease reports every lock on ls lost, once, and revokes it (it may
// still be alive if only our keep-alives failed).
func (d *Driver) loseLease(ls *lease, why string) {
	err := fmt.Errorf("etcdlock: session lease %x %s: %w", int64(ls.id), why, backend.ErrLost)
	d.mu.Lock()
	if !d.endLocked(ls, err) {
		d.mu.Unlock()
		return
	}
	var lost []func(error)
	for e := range ls.entries {
		if d.held[e.hk] == e {
			delete(d.held, e.hk)
		}
		if e.onLost != nil {
			lost = append(lost, e.onLost)
		}
	}
	ls.entries = map[*entry]struct{}{}
	d.mu.Unlock()
	for _, f := range lost {
		f(err)
	}
	d.revokeLater(ls.id)
}

// loseEntry reports one held lock lost: its entry is gone.
func (d *Driver) loseEntry(e *entry, why string) {
	if !d.dropChanged(e) {
		return // released meanwhile
	}
	if e.onLost != nil {
		e.onLost(fmt.Errorf("etcdlock: lock entry %s %s: %w", e.s.key, why, backend.ErrLost))
	}
}

// dropChanged forgets a held lock whose entry was deleted or overwritten
// by someone else, and leaves the key to the sweep (if its creation
// revision is still ours), which frees the slot once the key is gone:
// reused sooner, the name would make a retried acquisition take the
// stranger's key for its own.
func (d *Driver) dropChanged(e *entry) bool {
	if !d.forget(e) {
		return false
	}
	d.orphan(e.s, e.rev)
	return true
}

// revokeLater revokes a lease in the background, bounded by Close.
func (d *Driver) revokeLater(id clientv3.LeaseID) {
	d.mu.Lock()
	if d.gate.Closed() {
		d.mu.Unlock()
		d.revoke(context.Background(), id)
		return
	}
	d.bg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.bg.Done()
		d.revoke(d.gate.Context(), id)
	}()
}

// revoke revokes a lease, for up to opTimeout, whatever the answer.
func (d *Driver) revoke(ctx context.Context, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, _ = d.cli.Revoke(ctx, id)
}

// keepAlive renews ls every TTL/3 until the driver closes or the lease is
// lost, retires it when idle, verifies its entries and sweeps.
func (d *Driver) keepAlive(ls *lease) {
	period := ls.ttl / 3
	// After a failed keep-alive, try again soon: the lease ends a TTL
	// after the last one that got through.
	bo := retry.Backoff{Min: 20 * time.Millisecond, Max: max(period/8, 20*time.Millisecond)}
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-d.gate.Context().Done():
			return
		case <-ls.done.Done():
			return
		case <-timer.C:
		}
		if d.retireIfIdle(ls) {
			return
		}
		d.mu.Lock()
		until := ls.until
		d.mu.Unlock()
		start := time.Now()
		ctx, cancel := context.WithDeadline(d.gate.Context(), until)
		err := d.renew(ctx, ls)
		cancel()
		switch {
		case err == nil:
			bo.Reset()
			d.verify(ls)
			d.sweep()
			timer.Reset(max(period-time.Since(start), 0))
		case isLeaseNotFound(err):
			d.loseLease(ls, "was revoked or expired")
			return
		case d.gate.Context().Err() != nil:
			return
		case !time.Now().Before(until):
			d.loseLease(ls, fmt.Sprintf("got no keep-alive through for its whole TTL (%v): %v", ls.ttl, err))
			return
		default:
			timer.Reset(min(bo.Next(), time.Until(until)))
		}
	}
}

// retireIfIdle revokes ls if nothing used it for idleLease.
func (d *Driver) retireIfIdle(ls *lease) bool {
	d.mu.Lock()
	idle := ls.users == 0 && len(ls.entries) == 0 && !ls.idleSince.IsZero() && time.Since(ls.idleSince) > idleLease
	if idle {
		d.endLocked(ls, fmt.Errorf("etcdlock: session lease %x retired: %w", int64(ls.id), backend.ErrClosed))
	}
	d.mu.Unlock()
	if idle {
		for _, id := range append(d.takeMarks(ls), ls.id) {
			d.revoke(d.gate.Context(), id)
		}
	}
	return idle
}

// verify checks that the entries of the locks held on ls are unmodified
// since their creation or move (see Refresh), in one read-only
// transaction per 64 locks, and reports the others lost.
func (d *Driver) verify(ls *lease) {
	d.mu.Lock()
	entries := slices.Collect(maps.Keys(ls.entries))
	d.mu.Unlock()
	for batch := range slices.Chunk(entries, 64) {
		cmps := make([]clientv3.Cmp, len(batch))
		gets := make([]clientv3.Op, len(batch))
		for i, e := range batch {
			cmps[i] = clientv3.Compare(clientv3.ModRevision(e.s.key), "=", e.mod)
			gets[i] = clientv3.OpGet(e.s.key, clientv3.WithKeysOnly())
		}
		ctx, cancel := context.WithTimeout(d.gate.Context(), ls.ttl/3)
		resp, err := d.cli.Txn(ctx).If(cmps...).Else(gets...).Commit()
		cancel()
		if err != nil || resp.Succeeded {
			continue
		}
		for i, r := range resp.Responses {
			kvs := r.GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0 || kvs[0].CreateRevision != batch[i].rev:
				d.loseEntry(batch[i], "was deleted")
			case kvs[0].ModRevision != batch[i].mod:
				d.loseEntry(batch[i], "was overwritten by someone else")
			}
		}
	}
}

// sweep retries deleting entries whose deletion failed earlier.
func (d *Driver) sweep() {
	d.mu.Lock()
	orphans := maps.Clone(d.orphans)
	d.mu.Unlock()
	for s, rev := range orphans {
		ctx, cancel := context.WithTimeout(d.gate.Context(), opTimeout)
		_, ambiguous, err := d.deleteEntry(ctx, s.key, rev)
		cancel()
		d.mu.Lock()
		s.spent = s.spent || rev == 0 && (ambiguous || err != nil)
		if err == nil {
			delete(d.orphans, s)
			d.freeLocked(s)
		}
		d.mu.Unlock()
	}
}

func isLeaseNotFound(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
