package zklock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// permitted marks zk.ErrNoAuth as the permanent backend.ErrPermission.
func permitted(err error) error {
	if errors.Is(err, zk.ErrNoAuth) && !errors.Is(err, backend.ErrPermission) {
		return permError{err}
	}
	return err
}

type permError struct{ error }

func (e permError) Unwrap() []error { return []error{e.error, backend.ErrPermission} }

// transient reports whether err means "could not tell, try again".
func transient(err error) bool {
	return connLost(err) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrSessionMoved)
}

// connLost reports whether a request failed with its connection: the
// server may have run it. A failed write comes as the write's own error.
func connLost(err error) bool {
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) || errors.As(err, &ne)
}

func (d *Driver) closedErr(op string) error {
	return fmt.Errorf("zklock: %s: %w", op, backend.ErrClosed)
}

// call runs f, a blocking zk call, in a goroutine Close waits for, so that
// ctx can end the wait.
func call[T any](ctx context.Context, d *Driver, f func() (T, error)) (T, error) {
	var zero T
	if ctx.Done() == nil {
		return f()
	}
	if err := ctx.Err(); err != nil {
		return zero, context.Cause(ctx)
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	if !d.spawn(func() {
		v, err := f()
		ch <- result{v, err}
	}) {
		return zero, backend.ErrClosed
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, context.Cause(ctx)
	}
}

// callInline is call for one request: on the caller's goroutine when the
// driver can interrupt it (inline), cut when ctx ends (conntrack.CutOnEnd;
// see docs/backends/zklock.md, Calls and cancellation).
func callInline[T any](ctx context.Context, d *Driver, f func() (T, error)) (T, error) {
	if ctx.Done() == nil || !d.inline() {
		return call(ctx, d, f)
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, context.Cause(ctx)
	}
	w := d.dialed.conns.CutOnEnd(ctx)
	v, err := f()
	w.Stop()
	if err != nil && !answered(err) && ctx.Err() != nil {
		// Cut, or failed as ctx ended: what call's wait would say.
		return zero, context.Cause(ctx)
	}
	return v, err
}

// inline reports whether a call may run on the caller's goroutine: the
// driver dialed the connection (it can cut its reads) and has a session (a
// request is sent at once, not queued for the next connection).
func (d *Driver) inline() bool {
	return d.dialed != nil && !d.testNoInline && d.conn.State() == zk.StateHasSession
}

func (d *Driver) children(ctx context.Context, parent string) ([]string, error) {
	return callInline(ctx, d, func() ([]string, error) {
		names, _, err := d.conn.Children(parent)
		return names, err
	})
}

// newBackoff spaces the driver's retries: 20ms doubling to 500ms.
func newBackoff() *retry.Backoff {
	return &retry.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
}
