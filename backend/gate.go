package backend

import (
	"context"
	"sync"
)

// Gate is the guard a driver (and the locker Client) puts in front of its
// calls so that Close is clean: a call that enters after Close began gets
// ErrClosed, the contexts of calls in flight end when Close begins, and
// Close returns once they have all returned. The zero Gate is open.
type Gate struct {
	mu     sync.Mutex
	closed bool
	ctx    context.Context // ends when Close begins; made on first use
	cancel context.CancelFunc
	ops    sync.WaitGroup
	// calls in flight, a list that Close cancels: cheaper under parallel
	// calls than registering each with ctx (context.AfterFunc), whose
	// children map and lock every call would share.
	calls gateCall
	done  func()          // g.ops.Done, made once (lazy): the done of enterEndless's calls
	bg    context.Context // the context of enterEndless's calls on context.Background(), made once
	// the contexts of calls entered from another gate's endless calls (a
	// Client's, into its driver): one for each such gate, which ends with
	// either gate's Close (see enterEndless).
	joints map[context.Context]joint
}

// gateCall is one call in flight, linked in its Gate's list.
type gateCall struct {
	g          *Gate
	prev, next *gateCall
	cancel     context.CancelFunc
}

func (g *Gate) lazy() {
	if g.ctx == nil {
		g.ctx, g.cancel = context.WithCancel(context.Background())
		g.done, g.bg = g.ops.Done, gateCtx{g.ctx, context.Background()}
	}
}

// Enter registers a call. It returns ctx, ended also when Close begins,
// and done, which the call must call when it returns; or ErrClosed, and
// no done, once Close has begun.
func (g *Gate) Enter(ctx context.Context) (context.Context, func(), error) {
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		return g.enterEndless(ctx, nil)
	}
	if c, ok := ctx.(gateCtx); ok {
		return g.enterEndless(c.values, c.Context)
	}
	ctx, cancel := context.WithCancel(ctx)
	done, err := g.Track(cancel)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return ctx, done, nil
}

// Background enters work that is no call's (a cleanup, a probe) and that
// Close ends and awaits: closing ends when Close begins; ok is false, and
// there is no done, once it has.
func (g *Gate) Background() (closing context.Context, done func(), ok bool) {
	closing, done, err := g.Enter(context.Background())
	return closing, done, err == nil
}

// Track registers a call whose context the caller made, with its cancel,
// which Close calls: Enter without a context of its own, for a context
// that needs one anyway (a deadline on a context that ends with nothing
// else). It returns done, which the call must call when it returns, and
// which calls cancel; or ErrClosed, and no done, once Close has begun.
func (g *Gate) Track(cancel context.CancelFunc) (done func(), err error) {
	// Not reused from a pool: a done called twice (a driver's bug) would
	// then unlink another call, which Close would no longer end.
	c := &gateCall{g: g, cancel: cancel}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	if g.calls.next == nil {
		g.calls.next, g.calls.prev = &g.calls, &g.calls
	}
	c.prev, c.next = &g.calls, g.calls.next
	c.next.prev, g.calls.next = c, c
	g.ops.Add(1)
	g.mu.Unlock()
	return c.leave, nil
}

// enterEndless is Enter for a context that never ends
// (context.Background's, as a rule): the call's context is the gate's,
// with ctx's values, and needs no context nor place in the list of its
// own. A context derived from it registers with the gate's, which Close
// cancels, as its parent (see gateCtx.Value): in the map and under the
// lock that such calls share, which costs no allocation where a context
// in the list costs three.
//
// With other, the closing context of another gate, ctx was entered there
// (a Client's call into its driver): the call's context is then the
// joint of both gates', which ends with either and is made once.
func (g *Gate) enterEndless(ctx, other context.Context) (context.Context, func(), error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, nil, ErrClosed
	}
	g.lazy()
	j := joint{g.ctx, nil, g.bg}
	if other != nil && other != g.ctx {
		j = g.joint(other)
	}
	g.ops.Add(1)
	g.mu.Unlock()
	if ctx == context.Background() {
		return j.bg, g.done, nil // made once: no allocation
	}
	return gateCtx{j.ctx, ctx}, g.done, nil
}

// joint returns the context that ends when other or g's Close does,
// made under g.mu on first use, and forgotten once other has ended.
func (g *Gate) joint(other context.Context) joint {
	if j, ok := g.joints[other]; ok {
		return j
	}
	ctx, cancel := context.WithCancel(other)
	if g.joints == nil {
		g.joints = map[context.Context]joint{}
	}
	j := joint{ctx, cancel, gateCtx{ctx, context.Background()}}
	g.joints[other] = j
	context.AfterFunc(other, func() {
		g.mu.Lock()
		delete(g.joints, other)
		g.mu.Unlock()
	})
	return j
}

// joint is a context that ends with either of two gates, its cancel, and
// the context of its calls on context.Background().
type joint struct {
	ctx    context.Context
	cancel context.CancelFunc
	bg     context.Context
}

// gateCtx is the gate's context with the values of a call's context,
// which never ends.
type gateCtx struct {
	context.Context // the gate's
	values          context.Context
}

// Value is the gate's, or else values': the gate's context has values
// of its own only for context.WithCancel and context.Cause, which find
// its cancellation there. So a context derived from a gateCtx registers
// with the gate's (no goroutine of its own), and no cancellation a
// hand-written detached ctx passes through can be taken for the gate's.
func (c gateCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// leave is the done of c's call.
func (c *gateCall) leave() {
	g := c.g
	g.mu.Lock()
	if c.next != nil { // Close may have unlinked it
		c.prev.next, c.next.prev = c.next, c.prev
		c.prev, c.next = nil, nil
	}
	g.mu.Unlock()
	c.cancel()
	g.ops.Done()
}

// Closed reports whether Close has begun.
func (g *Gate) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Failed is the error of a call entered with ctx that failed with err:
// err, or, once ctx ended, ErrClosed if Close has begun, else ctx's cause.
func (g *Gate) Failed(ctx context.Context, err error) error {
	switch {
	case ctx.Err() == nil:
		return err
	case g.Closed():
		return ErrClosed
	}
	return context.Cause(ctx)
}

// Context returns a context that ends when Close begins, for work that is
// no single call's (a background loop, a session's keep-alive).
func (g *Gate) Context() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lazy()
	return g.ctx
}

// Close shuts the gate: later calls to Enter get ErrClosed, the calls in
// flight see their contexts end, and Close waits until they return. It
// reports whether this call closed the gate: false when Close had begun
// already, and then it returns at once.
func (g *Gate) Close() bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.closed = true
	g.lazy()
	var cancels []context.CancelFunc
	for c := g.calls.next; c != nil && c != &g.calls; {
		next := c.next
		cancels = append(cancels, c.cancel)
		c.prev, c.next = nil, nil
		c = next
	}
	g.calls.prev, g.calls.next = nil, nil
	for _, j := range g.joints {
		cancels = append(cancels, j.cancel)
	}
	g.mu.Unlock()
	g.cancel()
	// Outside the lock: a cancel runs its context's children's.
	for _, cancel := range cancels {
		cancel()
	}
	g.ops.Wait()
	return true
}
