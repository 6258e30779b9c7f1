package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
	"github.com/lockerhq/locker/internal/testenv"
)

// A call that runs on the caller's goroutine (inline, retry.go) still returns
// soon after its context ends on a connection that answers nothing: the
// read it waits on is cut, well before the zk client's own timeout (two
// thirds of the session timeout); the session lives on, and the node is
// deleted once the connection is back.
func TestInlineCallInterrupted(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	f := &freezer{}
	d := dial(t, servers, WithDialer(f.dialer))
	t.Cleanup(f.thaw)
	other := dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	l := lockFor(t, key)
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	sid := d.conn.SessionID()
	if !d.inline() {
		t.Fatal("the driver's own connection with a session runs no call inline")
	}
	// Within the grace and 300ms of the context's end (the zk client's own
	// timeout is 2/3 of testTimeout), counted from when the end was seen
	// by a goroutine of its own: a loaded machine fires the deadline's
	// timer late, which is not the call's lateness.
	const wait = 100 * time.Millisecond
	limit := conntrack.Grace + 300*time.Millisecond
	lateness := func(ctx context.Context, call func(context.Context) error) (time.Duration, error) {
		ended := make(chan time.Time, 1)
		context.AfterFunc(ctx, func() { ended <- time.Now() })
		err := call(ctx)
		returned := time.Now()
		if ctx.Err() == nil {
			return 0, err // returned before its context ended
		}
		return returned.Sub(<-ended), err
	}
	f.freeze()
	rctx, rcancel := context.WithTimeout(ctx, wait)
	late, err := lateness(rctx, func(ctx context.Context) error { return d.Release(ctx, l) })
	rcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Release on a frozen connection: %v, want the context's error", err)
	}
	if late > limit {
		t.Errorf("Release returned %v after its %v context ended, want at most %v", late, wait, limit)
	}
	// An acquisition's create, inline too.
	actx, acancel := context.WithTimeout(ctx, wait)
	late, err = lateness(actx, func(ctx context.Context) error {
		_, err := acquire(ctx, d, lockFor(t, uniqueKey(t)))
		return err
	})
	acancel()
	if err == nil {
		t.Error("Acquire on a frozen connection succeeded")
	}
	if late > limit {
		t.Errorf("Acquire returned %v after its %v context ended, want at most %v", late, wait, limit)
	}
	if d.dialed.conns.Cuts() == 0 {
		t.Error("no read was cut")
	}
	f.thaw()
	// The background deletion of the released node, on the same session.
	for entries(t, other, key) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the released lock's node is still there")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if now := d.conn.SessionID(); now != sid {
		t.Errorf("session %#x, want %#x still", now, sid)
	}
	if _, err := d.TryAcquire(ctx, lockFor(t, key)); err != nil && !errors.Is(err, backend.ErrNotAcquired) {
		t.Errorf("TryAcquire after the thaw: %v", err)
	}
}
