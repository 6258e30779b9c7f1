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
}

func (g *Gate) lazy() {
	if g.ctx == nil {
		g.ctx, g.cancel = context.WithCancel(context.Background())
	}
}

// Enter registers a call. It returns ctx, ended also when Close begins,
// and done, which the call must call when it returns; or ErrClosed, and
// no done, once Close has begun.
func (g *Gate) Enter(ctx context.Context) (context.Context, func(), error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, nil, ErrClosed
	}
	g.lazy()
	g.ops.Add(1)
	closing := g.ctx
	g.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(closing, cancel)
	return ctx, func() { stop(); cancel(); g.ops.Done() }, nil
}

// Closed reports whether Close has begun.
func (g *Gate) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
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
	g.mu.Unlock()
	g.cancel()
	g.ops.Wait()
	return true
}
