package etcdlock

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// enqueue puts l's entry at the back of the queue and waits until every
// older entry is gone.
func (d *Driver) enqueue(ctx context.Context, s *slot, l backend.Claim) (backend.Grant, error) {
	ls, dir, key := s.ls, s.dir, s.key
	// One transaction: our entry, and the two youngest entries, which are
	// ours and the one just ahead of us (if any). Retried, it finds our
	// entry already there.
	resp, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, l.Owner, clientv3.WithLease(ls.id)),
				clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly()))
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	var (
		rev     int64 // our entry's creation revision
		pred    *mvccpb.KeyValue
		checked = resp.Header.Revision // pred was just ahead of us at this revision
	)
	if resp.Succeeded {
		rev = resp.Header.Revision
		if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 1 {
			pred = kvs[1]
		}
	} else {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			d.free(s)
			return backend.Grant{}, errRequeue // gone again already
		}
		rev = kvs[0].CreateRevision
		if pred, checked, err = d.ahead(ctx, dir, key, rev); err != nil {
			return backend.Grant{}, d.abandon(ctx, s, rev, err)
		}
	}
	for pred != nil {
		if pred, checked, err = d.waitFor(ctx, ls, dir, key, rev, pred, checked); err != nil {
			return backend.Grant{}, d.abandon(ctx, s, rev, err)
		}
	}
	// ahead found our entry alive at the head of the queue, in the same
	// linearizable read: our lease was alive then, and the lock is ours.
	return d.grant(ctx, s, l, rev)
}

// abandon deletes the entry of a wait that failed.
func (d *Driver) abandon(ctx context.Context, s *slot, rev int64, err error) error {
	d.remove(ctx, s, rev)
	if errors.Is(err, errRequeue) || s.ls.isDone() {
		return errRequeue
	}
	if ctx.Err() != nil {
		return errors.Join(backend.ErrNotAcquired, d.ctxErr(ctx))
	}
	return err
}

func (ls *lease) isDone() bool {
	select {
	case <-ls.done:
		return true
	default:
		return false
	}
}

// ahead checks, in one linearizable read, that our entry still exists with
// revision rev, and returns the entry just ahead of it (nil: we hold the
// lock) and the revision of the read.
func (d *Driver) ahead(ctx context.Context, dir, key string, rev int64) (*mvccpb.KeyValue, int64, error) {
	resp, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev-1))...))
	})
	if err != nil {
		return nil, 0, err
	}
	if !resp.Succeeded {
		return nil, 0, errRequeue
	}
	var pred *mvccpb.KeyValue
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		pred = kvs[0]
	}
	return pred, resp.Header.Revision, nil
}

// stillThere reports whether pred still exists at a revision at least
// minRev, by a serializable read; false when it cannot tell.
func (d *Driver) stillThere(ctx context.Context, pred *mvccpb.KeyValue, minRev int64) bool {
	resp, err := d.cli.Get(ctx, string(pred.Key), clientv3.WithSerializable(), clientv3.WithKeysOnly())
	if err != nil || resp.Header.Revision < minRev {
		return false
	}
	return len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == pred.CreateRevision
}

// waitFor waits until pred, which was just ahead of our entry at revision
// checked, is deleted, and returns what is ahead of us then.
//
// The watch starts at the server's current revision, never at an older one:
// etcd serves a watch that starts in the past from a loop that runs every
// 100 ms, which would stall every hand-off. A delete between checked and the
// watch's start is caught by one read once the watch exists.
func (d *Driver) waitFor(ctx context.Context, ls *lease, dir, key string, rev int64, pred *mvccpb.KeyValue, checked int64) (*mvccpb.KeyValue, int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.cli.Watch(wctx, string(pred.Key), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-ls.done:
			return nil, 0, errRequeue
		case wr, ok = <-wch:
		}
		if !ok || wr.Canceled || wr.Err() != nil {
			// The watch broke (no leader, member gone): look again, after a
			// pause so that a lasting failure does not spin.
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, 0, ctx.Err()
			case <-t.C:
			}
			return d.ahead(ctx, dir, key, rev)
		}
		if wr.Created {
			if wr.Header.Revision <= checked {
				continue // the watch covers everything after checked
			}
			// Did pred go before the watch started? A local read of a
			// member that is at least as far as the watch's start is enough
			// to tell; anything else is settled by a linearizable read.
			if d.stillThere(ctx, pred, wr.Header.Revision) {
				continue // the watch sees its deletion
			}
			return d.ahead(ctx, dir, key, rev)
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return d.ahead(ctx, dir, key, rev)
			}
		}
	}
}

// txn commits the transaction that build makes, retrying while etcd is
// unavailable or between leaders. Every transaction of this package is safe
// to repeat.
func (d *Driver) txn(ctx context.Context, build func(context.Context) clientv3.Txn) (*clientv3.TxnResponse, error) {
	var ambiguous bool
	return d.txnAttempts(ctx, build, &ambiguous)
}

// attemptTimeout bounds one attempt of a transaction. A request that a
// follower forwarded to a leader which then died is not answered until the
// server's own request timeout (7 s with default settings), and the lock
// is unavailable meanwhile if that request was a release; sent again, it
// reaches the new leader. It is far above a healthy round trip, so that a
// slow but working cluster is not hammered with repeats.
const attemptTimeout = 2 * time.Second

// txnAttempts is txn, and sets *ambiguous when an attempt failed in a way
// that may have been applied.
//
// Every attempt requires a leader, so that a member that knows it has none
// answers at once (and the attempt is repeated) instead of holding the
// request until its timeout.
func (d *Driver) txnAttempts(ctx context.Context, build func(context.Context) clientv3.Txn, ambiguous *bool) (*clientv3.TxnResponse, error) {
	wait := 25 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), attemptTimeout)
		resp, err := build(actx).Commit()
		timedOut := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil || attempt == 8 || !(timedOut || transient(err)) || ctx.Err() != nil {
			return resp, permission(err)
		}
		*ambiguous = true
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(wait*2, 500*time.Millisecond)
	}
}

// transient reports errors after which a request may succeed when sent
// again: a member went away, or the cluster is between leaders.
func transient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, e := range []error{rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrTimeout,
		rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrNotCapable, rpctypes.ErrUnhealthy, rpctypes.ErrTooManyRequests} {
		if errors.Is(err, e) {
			return true
		}
	}
	s, ok := status.FromError(err)
	// A leader that is handing over leadership drops proposals, and etcd
	// passes raft's error on without a code of its own.
	return ok && (s.Code() == codes.Unavailable || strings.Contains(s.Message(), "raft proposal dropped"))
}
