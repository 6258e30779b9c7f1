package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// enqueue puts l's entry at the back of its queue and waits until it may
// go ahead: until no entry under over is older than it (a lock, a reader
// behind a writer, a writer), or, for a semaphore of limit permits, until
// fewer than limit are. Every request it sends counts in run: it returns a
// store's error once every request has failed for retry.Budget.
func (d *Driver) enqueue(ctx context.Context, run *retry.Failing, s *slot, l backend.Claim, over string, limit int) (backend.Grant, error) {
	w := &waiter{d: d, s: s, run: run, over: over, limit: limit, bo: retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second}}
	ls, key := s.ls, s.key
	val := l.Owner
	if limit > 0 {
		val = permitValue(limit, l.Owner)
	}
	// One transaction: our entry, and what decides whether it waits (the
	// two youngest entries under over, ours and the one just ahead of us,
	// if any; for a semaphore, the limit oldest). Retried, it finds our
	// entry already there.
	w.broken = d.brokenConn()
	resp, err := d.putRun(ctx, run, func(ctx context.Context) clientv3.Txn {
		d.tries.Add(1)
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(ls.id)), w.read()).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly()))
	})
	if err != nil {
		return backend.Grant{}, d.failedPut(ctx, s, err)
	}
	var (
		pred    *mvccpb.KeyValue
		checked = resp.Header.Revision // pred was just ahead of us at this revision
	)
	if resp.Succeeded {
		w.rev = resp.Header.Revision
		if pred, err = w.blocker(resp.Responses[1].GetResponseRange().GetKvs()); err != nil {
			return backend.Grant{}, w.abandon(ctx, err)
		}
	} else {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			d.free(s)
			return backend.Grant{}, errRequeue // gone again already
		}
		w.rev = kvs[0].CreateRevision
		if pred, checked, err = w.ahead(ctx); err != nil {
			return backend.Grant{}, w.abandon(ctx, err)
		}
	}
	waited := pred != nil
	for pred != nil {
		if pred, checked, err = w.waitFor(ctx, pred, checked); err != nil {
			return backend.Grant{}, w.abandon(ctx, err)
		}
	}
	// ahead found our entry alive at the head of the queue, in the same
	// linearizable read: our lease was alive then, and the lock is ours.
	g, err := d.grant(ctx, s, l, w.rev)
	g.Waited = waited && err == nil
	return g, err
}

// read is the range that decides whether w waits: the entries under
// w.over, the youngest two (a queue) or all of them (a semaphore: in the
// transaction that puts ours, all older than ours).
func (w *waiter) read() clientv3.Op {
	if w.limit > 0 {
		return clientv3.OpGet(w.over, clientv3.WithPrefix())
	}
	return clientv3.OpGet(w.over, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))
}

// blocker returns, from entries older than ours (and ours), one that w
// waits for, or nil. A semaphore's waiter notes the older entries, so that
// it reads again only once enough of them are gone.
func (w *waiter) blocker(kvs []*mvccpb.KeyValue) (*mvccpb.KeyValue, error) {
	key := w.s.key
	if w.limit > 0 {
		older := make(map[string]struct{}, len(kvs))
		for _, kv := range kvs {
			if string(kv.Key) == key {
				continue
			}
			if n := limitOf(kv); n != w.limit {
				return nil, limitMismatch(n, w.limit)
			}
			older[string(kv.Key)] = struct{}{}
		}
		if len(older) < w.limit {
			return nil, nil
		}
		w.older = older
		return kvs[0], nil
	}
	for _, kv := range kvs {
		if string(kv.Key) != key {
			return kv, nil
		}
	}
	return nil, nil
}

// waiter is one blocking acquisition's entry in its queue.
type waiter struct {
	d      *Driver
	s      *slot
	over   string              // the entries that may be ahead of ours
	limit  int                 // a semaphore's: how many may be; 0: none
	older  map[string]struct{} // a semaphore's: the entries ahead at the last read
	rev    int64               // the entry's creation revision
	run    *retry.Failing      // the acquisition's run of store failures
	bo     retry.Backoff       // the pause after a broken watch
	broken <-chan struct{}     // closed when the connection goes down after our last request
}

// abandon handles the end of a wait that failed with err: the entry goes
// now, with its lease, or (etcd out of reach) by the background sweep.
func (w *waiter) abandon(ctx context.Context, err error) error {
	d, s := w.d, w.s
	switch {
	case errors.Is(err, errRequeue):
		d.free(s) // our entry is gone
		return err
	case s.ls.isDone():
		// Lost (or closed): the server drops the lease, and our entry with
		// it, if it has not already. After a failure budget spent, the
		// store's error stands; otherwise queue again.
		d.free(s)
		switch {
		case ctx.Err() != nil:
			return d.ended(ctx)
		case resendable(err):
			return err
		}
		return errRequeue
	}
	d.drop(ctx, s, w.rev, err)
	if ctx.Err() != nil {
		return d.ended(ctx)
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
// its revision, and returns an entry ahead of it that it waits for (nil: we
// hold the lock) and the revision of the read.
func (w *waiter) ahead(ctx context.Context) (*mvccpb.KeyValue, int64, error) {
	d, key := w.d, w.s.key
	w.broken = d.brokenConn()
	resp, _, err := d.txnRun(ctx, w.run, func(ctx context.Context) clientv3.Txn {
		d.tries.Add(1)
		get := clientv3.OpGet(w.over, append(clientv3.WithLastCreate(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(w.rev-1))...)
		if w.limit > 0 {
			get = clientv3.OpGet(w.over, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(w.rev-1))
		}
		return d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", w.rev)).
			Then(get)
	})
	if err != nil {
		return nil, 0, err
	}
	if !resp.Succeeded {
		return nil, 0, errRequeue
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if w.limit > 0 {
		pred, err := w.blocker(kvs)
		return pred, resp.Header.Revision, err
	}
	var pred *mvccpb.KeyValue
	if len(kvs) > 0 {
		pred = kvs[0]
	}
	return pred, resp.Header.Revision, nil
}

// stillThere reports whether pred still exists at a revision at least
// minRev, by a serializable read; false when it cannot tell.
func (d *Driver) stillThere(ctx context.Context, pred *mvccpb.KeyValue, minRev int64) bool {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
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
//
// The etcd client resumes a broken watch by itself, silently, for as long
// as it takes; so when every connection to etcd goes down, the waiter
// checks its place at once, and its requests, failing, count against its
// failure budget.
func (w *waiter) waitFor(ctx context.Context, pred *mvccpb.KeyValue, checked int64) (*mvccpb.KeyValue, int64, error) {
	d := w.d
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// The client's Watch blocks until it has a stream to the server, for
	// as long as that takes: end it when the connection or the lease goes.
	returned := make(chan struct{})
	defer close(returned)
	broken, lost := w.broken, w.s.ls.done
	go func() {
		select {
		case <-broken:
		case <-lost:
		case <-returned:
		}
		cancel()
	}()
	// A semaphore's waiter may go ahead when any older entry goes: it
	// watches the whole directory.
	wkey, wopts := string(pred.Key), []clientv3.OpOption{clientv3.WithFilterPut(), clientv3.WithCreatedNotify()}
	if w.limit > 0 {
		wkey, wopts = w.over, append(wopts, clientv3.WithPrefix())
	}
	wch := d.cli.Watch(wctx, wkey, wopts...)
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-w.s.ls.done:
			return nil, 0, errRequeue
		case <-w.broken:
			return w.ahead(ctx)
		case wr, ok = <-wch:
		}
		if !ok || wr.Canceled || wr.Err() != nil {
			select {
			case <-w.s.ls.done:
				return nil, 0, errRequeue
			case <-w.broken:
				return w.ahead(ctx)
			default:
			}
			// The watch broke (no leader, member gone): look again, after a
			// pause so that a lasting failure does not spin.
			if err := retry.Sleep(ctx, w.bo.Next()); err != nil {
				return nil, 0, err
			}
			return w.ahead(ctx)
		}
		switch {
		case wr.Created:
			if wr.Header.Revision <= checked {
				continue // the watch covers everything after checked
			}
			// Did pred go before the watch started? A local read of a
			// member that is at least as far as the watch's start is enough
			// to tell; anything else is settled by a linearizable read.
			if w.limit == 0 {
				if d.stillThere(ctx, pred, wr.Header.Revision) {
					continue // the watch sees its deletion
				}
				return w.ahead(ctx)
			}
		case !slices.ContainsFunc(wr.Events, func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE }):
			continue
		default:
			w.bo.Reset()
		}
		if w.limit == 0 {
			return w.ahead(ctx)
		}
		// A semaphore's waiter keeps its watch of the directory, which
		// reports every deletion since it started, across its reads, and
		// reads again once fewer than limit entries are left ahead (or its
		// own is gone).
		if !wr.Created && !w.freed(wr.Events, checked) {
			continue
		}
		p, c, err := w.ahead(ctx)
		if err != nil || p == nil {
			return p, c, err
		}
		checked = c
	}
}

// freed notes the deletions in evs after revision checked, and reports
// whether fewer than limit entries are left ahead, or ours went.
func (w *waiter) freed(evs []*clientv3.Event, checked int64) bool {
	mine := false
	for _, ev := range evs {
		if ev.Type != mvccpb.DELETE || ev.Kv.ModRevision <= checked {
			continue
		}
		delete(w.older, string(ev.Kv.Key))
		mine = mine || string(ev.Kv.Key) == w.s.key
	}
	return mine || len(w.older) < w.limit
}

// brokenConn returns a channel closed when every connection of the etcd
// client next goes down.
func (d *Driver) brokenConn() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broken
}

// watchConn closes d.broken, and makes a new one, each time the client's
// gRPC connection leaves the Ready state (every endpoint is unreachable),
// until the driver closes.
func (d *Driver) watchConn() {
	defer d.bg.Done()
	ctx := d.gate.Context()
	conn := d.cli.ActiveConnection()
	for {
		st := conn.GetState()
		if !conn.WaitForStateChange(ctx, st) {
			return
		}
		if st == connectivity.Ready {
			d.mu.Lock()
			close(d.broken)
			d.broken = make(chan struct{})
			d.mu.Unlock()
		}
	}
}

// txn commits the transaction that build makes, sending it again while
// etcd is out of reach or between leaders, for up to retry.Budget. Every
// transaction of this package is safe to repeat.
func (d *Driver) txn(ctx context.Context, build func(context.Context) clientv3.Txn) (*clientv3.TxnResponse, error) {
	resp, _, err := d.txnRun(ctx, new(retry.Failing), build)
	return resp, err
}

// txnRun is txn within a run of failures that may have begun before it
// (a blocking acquisition's), and reports whether an attempt failed in a
// way that may have been applied.
func (d *Driver) txnRun(ctx context.Context, run *retry.Failing, build func(context.Context) clientv3.Txn) (resp *clientv3.TxnResponse, ambiguous bool, err error) {
	ambiguous, err = d.resend(ctx, run, func(ctx context.Context) (err error) {
		resp, err = build(ctx).Commit()
		return err
	})
	return resp, ambiguous, err
}

// attemptTimeout bounds one attempt of a request. A request that a
// follower forwarded to a leader which then died is not answered until the
// server's own request timeout (7 s with default settings), and the lock
// is unavailable meanwhile if that request was a release; sent again, it
// reaches the new leader. It is far above a healthy round trip, so that a
// slow but working cluster is not hammered with repeats.
const attemptTimeout = 2 * time.Second

// errUnanswered is an attempt that timed out. The client waits for a
// connection rather than fail at once, so this is also how an unreachable
// cluster shows.
var errUnanswered = fmt.Errorf("no answer from etcd within %v", attemptTimeout)

// resend calls send, each attempt bounded by attemptTimeout and requiring
// a leader (see attempt), until it succeeds,
// fails in a way that sending again cannot fix, or every attempt of run has
// failed for retry.Budget. It reports whether an attempt failed in a way
// that may have been applied.
func (d *Driver) resend(ctx context.Context, run *retry.Failing, send func(context.Context) error) (ambiguous bool, err error) {
	bo := retry.Backoff{Min: 25 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		sent := time.Now()
		actx, cancel := d.attempt(ctx)
		err = send(actx)
		if err != nil && actx.Err() != nil && ctx.Err() == nil {
			err = errUnanswered
		}
		cancel()
		if err == nil {
			run.Ok()
			return ambiguous, nil
		}
		if ctx.Err() != nil || !resendable(err) || run.Fail(sent, retry.Budget) {
			return ambiguous, permission(err)
		}
		ambiguous = true
		if retry.Sleep(ctx, bo.Next()) != nil {
			return ambiguous, err
		}
	}
}

// resendable reports errors after which the same request may succeed when
// sent again: etcd did not answer, or it could not serve it for now.
func resendable(err error) bool {
	return errors.Is(err, errUnanswered) || transient(err)
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

// errUnsettled is a transaction that may have put an entry and was not
// answered within CancelGrace after its caller gave up.
var errUnsettled = fmt.Errorf("no answer from etcd within %v after the caller gave up", backend.CancelGrace)

// putRun is txnRun for a transaction that may put an entry: an attempt in
// flight when ctx ends is answered, not abandoned, for up to CancelGrace
// (further attempts may go meanwhile), so that the caller learns whether
// its entry exists and can delete it before it returns. Abandoned, it
// could still be applied after that delete: etcd proposes each request
// from a goroutine of its own, so a delete sent later may be applied
// first, and the entry would then hold the name for nobody, its lease
// kept alive by the driver's other locks. An attempt still unanswered
// after the grace returns errUnsettled: its entry, if any, is left to the
// background sweep (see drop), not waited for again.
func (d *Driver) putRun(ctx context.Context, run *retry.Failing, build func(context.Context) clientv3.Txn) (*clientv3.TxnResponse, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var unsettled atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(backend.CancelGrace)
		defer t.Stop()
		select {
		case <-t.C:
			unsettled.Store(true)
			cancel()
		case <-sctx.Done():
		}
	})
	defer stop()
	resp, _, err := d.txnRun(sctx, run, build)
	if err != nil && unsettled.Load() {
		return nil, fmt.Errorf("%w: %w", errUnsettled, context.Cause(ctx))
	}
	return resp, err
}
