package locker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A call is one driver call that its caller stops waiting for as soon as
// its context ends. Drivers must return within a round trip of that (see
// backend.Driver), but a waiter, who may cancel at any moment, is not left
// to depend on every client library doing so on a dead connection. The
// call then finishes in the background, counted in Client.bg, and undo
// frees what it brings back: nobody holds it. The handoff to another
// goroutine costs tens of microseconds on an idle machine, so the
// uncontended path (a first try, a release, a refresh) calls the driver
// directly.
type call[T any] struct {
	state atomic.Int32 // callRunning, then callDone or callAbandoned
	done  chan struct{}
	val   T
	err   error
}

const (
	callRunning = iota
	callDone
	callAbandoned
)

// guard runs f for the caller until ctx ends. undo, if not nil, frees a
// value f returns without error after that.
func guard[T any](c *Client, ctx context.Context, f func(context.Context) (T, error), undo func(T)) (T, error) {
	cl := &call[T]{done: make(chan struct{})}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		cl.val, cl.err = f(ctx)
		if cl.state.CompareAndSwap(callRunning, callDone) {
			close(cl.done)
			return
		}
		if cl.err == nil && undo != nil {
			undo(cl.val)
		}
	}()
	select {
	case <-cl.done:
		return cl.val, cl.err
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callRunning, callAbandoned) {
			var zero T
			return zero, context.Cause(ctx)
		}
		<-cl.done
		return cl.val, cl.err
	}
}

// tryAcquire is the driver's TryAcquire, guarded: a grant that arrives
// after the caller gave up is released.
func (c *Client) tryAcquire(ctx context.Context, req backend.Claim) (backend.Grant, error) {
	return guard(c, ctx, func(ctx context.Context) (backend.Grant, error) {
		return c.drv.TryAcquire(ctx, req)
	}, func(backend.Grant) { c.releaseNow(req) })
}

// errCall runs a driver call that brings back only an error, guarded.
func (c *Client) errCall(ctx context.Context, f func(context.Context) error) error {
	_, err := guard(c, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, f(ctx)
	}, nil)
	return err
}

// releaseLater frees l in the background, bounded, for a grant that nobody
// will hold: one the store made after the caller gave up, or one that
// arrived as the Client closed. Release checks the token, so it never
// touches another holder's lock.
func (c *Client) releaseLater(l backend.Claim) {
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		c.releaseNow(l)
	}()
}

func (c *Client) releaseNow(l backend.Claim) {
	ctx, cancel := context.WithTimeout(context.Background(), closeReleaseTimeout)
	defer cancel()
	_ = c.errCall(ctx, func(ctx context.Context) error { return c.drv.Release(ctx, l) })
}

// closeReleaseTimeout bounds a release nobody waits for, and those Close
// makes: a lock the store does not confirm released by then expires after
// its TTL.
const closeReleaseTimeout = time.Second
