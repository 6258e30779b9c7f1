package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// txn commits the transaction that build makes, sent again as resend
// says within run (a run of failures that may have begun before it), and
// reports whether a failed attempt may have been applied. Every
// transaction of this package is safe to repeat.
func (d *Driver) txn(ctx context.Context, run *retry.Failing, build func(context.Context) clientv3.Txn) (resp *clientv3.TxnResponse, ambiguous bool, err error) {
	ambiguous, err = d.resend(ctx, run, func(ctx context.Context) (err error) {
		resp, err = build(ctx).Commit()
		return err
	})
	return resp, ambiguous, err
}

// attemptTimeout bounds one attempt of a request: sent again, a request
// forwarded to a leader that died reaches the new one (see "Store
// failures" in docs/backends/etcdlock.md for the choice of 2s).
const attemptTimeout = 2 * time.Second

// get reads key, sent again as txn is.
func (d *Driver) get(ctx context.Context, key string, opts ...clientv3.OpOption) (resp *clientv3.GetResponse, err error) {
	_, err = d.resend(ctx, new(retry.Failing), func(ctx context.Context) (err error) {
		resp, err = d.cli.Get(ctx, key, opts...)
		return err
	})
	return resp, err
}

// errUnanswered is an attempt that timed out: also how an unreachable
// cluster shows, since the client waits for a connection.
var errUnanswered = fmt.Errorf("no answer from etcd within %v", attemptTimeout)

// resend calls send, each attempt cut by the cutter and requiring a
// leader, until it succeeds, fails for good, or run's attempts have failed
// for retry.Budget; a nil run sends once (a queue's steps: the Client
// retries them). It reports whether a failed attempt may have been applied.
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
			if run != nil {
				run.Ok()
			}
			return ambiguous, nil
		}
		if ctx.Err() != nil || !resendable(err) || run == nil || run.Fail(sent, retry.Budget) {
			return ambiguous, permission(err)
		}
		ambiguous = true
		if !bo.Pause(ctx) {
			return ambiguous, err
		}
	}
}

// resendable reports errors after which the request may succeed sent
// again: no answer, a member gone, no leader, or too busy for now.
func resendable(err error) bool {
	switch {
	case errors.Is(err, errUnanswered):
		return true
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
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

// putRun is txn for a transaction that may put an entry: an attempt in
// flight when ctx ends is awaited for up to CancelGrace, so that the
// caller learns whether its entry exists and can delete it (an abandoned
// put may land after a later delete: see "Store failures" in the docs);
// past it, errUnsettled, and the entry is left to the sweep.
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
	resp, _, err := d.txn(sctx, run, build)
	if err != nil && unsettled.Load() {
		return nil, fmt.Errorf("%w: %w", errUnsettled, context.Cause(ctx))
	}
	return resp, err
}
