package sqldb

import (
	"context"
	"time"

	"github.com/lockerhq/locker/backend"
)

const (
	// writeTimeout bounds a detached write: how long its answer is
	// awaited, whatever its caller's deadline; the failure budget, so that
	// a blackholed connection fails a waiting Acquire in time.
	writeTimeout = backend.StoreFailureBudget
	// undoTimeout bounds an undo, within Close's 2 s.
	undoTimeout = time.Second
	// cancelWait is how long a caller whose ctx ended still waits for its
	// write's answer (and undo), within backend.CancelGrace.
	cancelWait = backend.CancelGrace * 3 / 4
)

// write runs f, a write that may grant a lock, so that a caller who gives
// up leaves nothing held. database/sql drivers abandon a statement whose
// context ends (go-sql-driver/mysql closes its connection), but the
// server may still apply it, after any undo sent on another connection.
// So f runs on a context of its own (ended by writeTimeout or Close, not
// by the caller) and keeps its connection until the server answers; the
// caller waits for that answer up to cancelWait after its ctx ended. Once
// the answer came, whoever finds it unwanted (granted, but the caller
// left; or unknown, a broken connection) runs undo, which frees the
// token's row: always after the write, never before it. An undo that
// fails or comes too late leaves the lock to its TTL.
//
// An in-process database (Dialect.inProcess) applies nothing after its
// call returns, so f runs on the caller's ctx and the undo follows at
// once when it is needed.
func (d *Driver) write(ctx context.Context, f, undo func(context.Context) error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx) // nothing sent, nothing to undo
	}
	if d.dialect.inProcess {
		return d.settle(ctx, f(ctx), undo)
	}
	done := make(chan error, 1)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	stop := context.AfterFunc(d.gate.Context(), cancel)
	d.writes.Add(1)
	go func() {
		defer d.writes.Done()
		err := f(wctx)
		stop()
		cancel()
		done <- d.settle(ctx, err, undo)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(cancelWait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return context.Cause(ctx)
	}
}

// settle returns the error of a write that answered err, after undoing
// what nobody will hold: a grant whose caller's ctx ended, or a write
// whose fate is unknown (a broken connection).
func (d *Driver) settle(ctx context.Context, err error, undo func(context.Context) error) error {
	switch {
	case err == nil && ctx.Err() != nil:
		d.undo(undo)
		return context.Cause(ctx)
	case err != nil && d.dialect.classify(err) == errOther && !answered(err):
		d.undo(undo)
	}
	return err
}

// undo runs an undo, bounded by undoTimeout and not by Close: a lock
// taken as its caller gave up would stay held for its TTL. In process, the
// caller waits for it whole: it is one statement, which takes longer than
// the caller's grace only when the machine is starved or the file locked,
// and returning before it would leave a row that nobody holds.
func (d *Driver) undo(undo func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	_ = undo(ctx)
}
