package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A lock taken with a delay (locker.LockDelay) has a marker beside its
// entry: <dir>~<entry's name>, valued "<fence> <owner>" (fence 0: the
// marker's own creation revision, put in the entry's transaction). '~'
// follows every character of an entry's name, so a queue's markers are
// one range at its end, inside the directory that a try-acquire finds
// empty. The marker is on a lease of its own that outlives the session by
// the delay; Release deletes it with the entry (see "Lock-delay" in
// docs/backends/etcdlock.md).

var _ backend.Delayer = (*Driver)(nil)

// KeepsDelay implements backend.Delayer: every etcd keeps markers.
func (d *Driver) KeepsDelay() bool { return true }

// markPad is added to a marker's lease: etcd revokes expired leases every
// 500ms, and the marker's lease is renewed a round trip before the
// session's, so without it the marker could go up to that much before the
// delay after the session's end.
const markPad = time.Second

// mark is the lease of the markers of one session's locks of one delay:
// granted for the session's TTL, the delay and markPad, and renewed just
// before the session, so it ends at least the delay after the session does,
// and at most the delay plus markPad after that. Its fields are guarded by
// the driver's mutex.
type mark struct {
	id        clientv3.LeaseID
	sec       int64     // the delay in seconds, rounded up: its key in lease.marks
	n         int       // slots with a marker on it, or about to put one
	idleSince time.Time // when n last fell to 0
}

// markKey is the key of the marker of the entry key.
func markKey(key string) string {
	i := strings.LastIndexByte(key, '/') + 1
	return key[:i] + "~" + key[i:]
}

// isMark reports whether key is a marker's.
func isMark(key []byte) bool {
	i := strings.LastIndexByte(string(key), '/') + 1
	return i < len(key) && key[i] == '~'
}

// marks is the range of dir's markers.
func marks(dir string) clientv3.Op {
	return clientv3.OpGet(dir+"~", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2))
}

// putMark is the put of s's marker; fence 0 is the marker's own creation
// revision.
func putMark(s *slot, fence int64, owner string) clientv3.Op {
	return clientv3.OpPut(markKey(s.key), strconv.FormatInt(fence, 10)+" "+owner, clientv3.WithLease(s.mark.id))
}

// markOf reads a marker: the lost holder's fence and owner.
func markOf(kv *mvccpb.KeyValue) (fence int64, owner string) {
	f, owner, _ := strings.Cut(string(kv.Value), " ")
	fence, _ = strconv.ParseInt(f, 10, 64)
	if fence == 0 {
		fence = kv.CreateRevision
	}
	return fence, owner
}

// useMark returns ls's mark lease for delay, granting one if needed,
// counted in its n until the slot that takes it is freed.
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
	want := ls.sec + sec + int64(markPad/time.Second)
	var resp *clientv3.LeaseGrantResponse
	_, err = d.resend(ctx, run, func(ctx context.Context) (err error) {
		resp, err = d.cli.Grant(ctx, want)
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.TTL < want {
		d.revokeLater(resp.ID)
		return nil, fmt.Errorf("%w: etcd granted a %ds lease for %ds", backend.ErrInvalidTTL, resp.TTL, want)
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
		// The session is gone, or a concurrent acquisition granted one
		// first.
		d.revokeLater(resp.ID)
	}
	if m == nil {
		return nil, backend.ErrRequeue
	}
	return m, nil
}

// unmark ends a slot's or an acquisition's use of m. Call with the
// driver's mutex held.
func unmark(m *mark) {
	if m.n--; m.n == 0 {
		m.idleSince = time.Now()
	}
}

// markLater puts the marker of a waiter's entry s, of creation revision
// rev, once its claim holds the key: ErrRequeue if the entry is gone.
func (d *Driver) markLater(ctx context.Context, s *slot, rev int64, owner string) error {
	resp, _, err := d.txnRun(ctx, nil, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", rev)).Then(putMark(s, rev, owner))
	})
	switch {
	case isLeaseNotFound(err):
		d.loseLease(s.ls, "or its marker's lease was not found by the server")
		return backend.ErrRequeue
	case err != nil:
		return err
	case !resp.Succeeded:
		return backend.ErrRequeue
	}
	return nil
}

// keepMarks renews ls's mark leases, before ls itself, and revokes the ones
// idle for idleLease. A mark lease the server no longer has (revoked by
// hand) is dropped: its locks keep no delay any more.
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

// takeMarks removes ls's mark leases, for the caller to revoke (which
// deletes their markers) when ls ends by the driver's choice (Close,
// retired idle), not by a loss.
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
