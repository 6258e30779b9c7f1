package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A call that runs on the caller's goroutine (interrupt.go) still returns
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
	const wait = 100 * time.Millisecond
	limit := wait + interruptGrace + 300*time.Millisecond // the zk client's own: 2/3 of testTimeout
	f.freeze()
	rctx, rcancel := context.WithTimeout(ctx, wait)
	start := time.Now()
	err := d.Release(rctx, l)
	took := time.Since(start)
	rcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Release on a frozen connection: %v, want the context's error", err)
	}
	if took > limit {
		t.Errorf("Release took %v after a %v context, want at most %v", took, wait, limit)
	}
	// An acquisition's create, inline too.
	actx, acancel := context.WithTimeout(ctx, wait)
	start = time.Now()
	_, err = d.Acquire(actx, lockFor(t, uniqueKey(t)))
	took = time.Since(start)
	acancel()
	if err == nil {
		t.Error("Acquire on a frozen connection succeeded")
	}
	if took > limit {
		t.Errorf("Acquire took %v after a %v context, want at most %v", took, wait, limit)
	}
	if d.cuts.Load() == 0 {
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
