package etcdlock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A lock taken with a delay (locker.LockDelay) is its own marker: its
// entry is on a lease that outlives the session by the delay, and is
// reported lost with the session; otherwise it is an entry like any other
// (see "Lock-delay" in docs/backends/etcdlock.md).

var _ backend.Delayer = (*Driver)(nil)

// KeepsDelay implements backend.Delayer: every etcd does.
func (d *Driver) KeepsDelay() bool { return true }

// markPad is added to a mark lease: etcd revokes expired leases every
// 500ms, and a mark lease is renewed a round trip before its session, so
// without it a delayed entry could go that much before the delay ends.
const markPad = time.Second

// mark is the lease of one session's delayed entries of one delay (in
// whole seconds): granted for the session's TTL, the delay and markPad,
// and renewed just before the session, so its entries go at least the
// delay, at most the delay and markPad, after the session ends. The
// driver's mutex guards its fields.
type mark struct {
	id        clientv3.LeaseID
	sec       int64     // the delay in seconds, rounded up: its key in lease.marks
	n         int       // slots on it, and acquisitions about to put one
	idleSince time.Time // when n last fell to 0
}

// useMark returns ls's mark lease for delay, granted if needed, counted
// in its n until the slot that takes it is freed.
func (d *Driver) useMark(ctx context.Context, run *retry.Failing, ls *lease, delay time.Duration) (*mark, error) {
	sec, err := ttlSeconds(delay)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	if m := ls.marks[sec]; m != nil {
		m.n++
		d.mu.Unlock()
		return m, nil
	}
	d.mu.Unlock()
	resp, _, err := d.grantLease(ctx, run, ls.sec+sec+int64(markPad/time.Second))
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	m, gone := ls.marks[sec], ls.err != nil
	if m == nil && !gone {
		m = &mark{id: resp.ID, sec: sec}
		ls.marks[sec] = m
	}
	if m != nil {
		m.n++
	}
	d.mu.Unlock()
	if m == nil || m.id != resp.ID {
		// The session is gone, or a concurrent acquisition granted one.
		d.revokeLater(resp.ID)
	}
	if m == nil {
		return nil, backend.ErrRequeue
	}
	return m, nil
}

// leaseOf is the lease of s's entry: its mark's if it has one.
func (s *slot) leaseOf() clientv3.LeaseID {
	if s.mark != nil {
		return s.mark.id
	}
	return s.ls.id
}

// toMark moves a waiter's entry s, of creation revision rev, to its mark
// lease once it holds, and returns its new modification revision;
// ErrRequeue if the entry is gone.
func (d *Driver) toMark(ctx context.Context, s *slot, rev int64) (int64, error) {
	resp, _, err := d.txn(ctx, nil, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", rev)).
			Then(clientv3.OpPut(s.key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(s.mark.id)))
	})
	switch {
	case isLeaseNotFound(err):
		d.loseLease(s.ls, "or its mark lease was not found by the server")
		return 0, backend.ErrRequeue
	case err != nil:
		return 0, err
	case !resp.Succeeded:
		return 0, backend.ErrRequeue
	}
	return resp.Header.Revision, nil
}

// keepMarks renews ls's mark leases and revokes those idle for idleLease.
// One the server no longer has is dropped: its entries went with it, and
// verify reports them lost.
func (d *Driver) keepMarks(ctx context.Context, ls *lease) error {
	d.mu.Lock()
	var keep, idle []*mark
	for sec, m := range ls.marks {
		if m.n == 0 && time.Since(m.idleSince) > idleLease {
			delete(ls.marks, sec)
			idle = append(idle, m)
		} else {
			keep = append(keep, m)
		}
	}
	d.mu.Unlock()
	for _, m := range idle {
		d.revokeLater(m.id)
	}
	for _, m := range keep {
		_, err := d.cli.KeepAliveOnce(ctx, m.id)
		switch {
		case isLeaseNotFound(err):
			d.mu.Lock()
			if ls.marks[m.sec] == m {
				delete(ls.marks, m.sec)
			}
			d.mu.Unlock()
		case err != nil:
			return fmt.Errorf("mark lease %x: %w", int64(m.id), err)
		}
	}
	return nil
}

// takeMarks removes ls's mark leases, for the caller to revoke when ls
// ends by the driver's choice (Close, idle), not by a loss.
func (d *Driver) takeMarks(ls *lease) []clientv3.LeaseID {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []clientv3.LeaseID
	for sec, m := range ls.marks {
		delete(ls.marks, sec)
		ids = append(ids, m.id)
	}
	return ids
}
