package locker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A call is one driver call that its caller stops waiting for as soon as
// its context ends; a call whose value must be undone (a grant) is waited
// for CancelGrace longer, so that what it brings back is undone before the
// caller returns. Drivers must return within a round trip of that (see
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
// value f returns without error after that: before guard returns, if f
// and undo are done within CancelGrace of the end of ctx (so that a grant
// made as the caller gave up holds nothing once the call has returned),
// else in the background. Without undo, guard returns as ctx ends.
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
	var zero T
	select {
	case <-cl.done:
		return cl.val, cl.err
	case <-ctx.Done():
	}
	if undo != nil {
		// The call, on its way back, may bring a grant that nobody will
		// hold: wait for it, and undo it, before returning.
		until := time.Now().Add(backend.CancelGrace)
		t := time.NewTimer(backend.CancelGrace)
		defer t.Stop()
		select {
		case <-cl.done:
			if cl.err != nil {
				return zero, cl.err
			}
			c.within(until, func() { undo(cl.val) })
			return zero, context.Cause(ctx)
		case <-t.C:
		}
	}
	if cl.state.CompareAndSwap(callRunning, callAbandoned) {
		return zero, context.Cause(ctx)
	}
	// Done just now.
	<-cl.done
	if cl.err == nil && undo != nil {
		c.within(time.Now(), func() { undo(cl.val) })
		return zero, context.Cause(ctx)
	}
	return cl.val, cl.err
}

// within runs f, and waits for it until until; what f has not done by
// then goes on in the background, counted in Client.bg.
func (c *Client) within(until time.Time, f func()) {
	fin := make(chan struct{})
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer close(fin)
		f()
	}()
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-fin:
	case <-t.C:
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
// will hold: one that arrived as the Client closed, or one a driver may
// have left as its caller gave up (the driver's own undo should have taken
// it back already). Release checks the token, so it never touches another
// holder's lock.
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
