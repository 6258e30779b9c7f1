package pglock

import (
	"context"
	"time"
)

// undoTimeout bounds a cleanup statement.
const undoTimeout = 2 * time.Second

// undo runs f, the cleanup of a statement that may have committed, in the
// background: the caller, who may have given up, does not wait for a store
// that may not answer. It is called from within a call (d.enter), so Close,
// which waits for the calls, then waits for the cleanups before it closes
// the pool; and their context is not the gate's, so Close beginning does
// not cut them short (a lock taken as the caller gave up would otherwise
// stay held for its TTL). The channel returned closes when f returns.
func (d *Driver) undo(f func(ctx context.Context)) <-chan struct{} {
	d.undos.Add(1)
	done := make(chan struct{})
	go func() {
		defer d.undos.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
		defer cancel()
		f(ctx)
	}()
	return done
}
