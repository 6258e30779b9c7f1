package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// Cut off from the server, every method returns within CancelGrace after
// its context ends, even while another call, with a longer context, holds
// the table check. (Before: the table check was behind a mutex, and a call
// waited for the other one's whole context, 5 s here.)
func TestCallsReturnWhenCtxEndsCutOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p, purl := proxied(t, h.url)
	ctx := context.Background()
	d, err := Open(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l := backend.Claim{Key: "ctx/x", Token: randHex(16), TTL: time.Minute}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	l.Fence = g.Fence

	p.Blackhole()
	d.schemaOK.Store(false) // the next call checks the table again
	long, cancelLong := context.WithTimeout(ctx, 5*time.Second)
	defer cancelLong()
	checking := make(chan struct{})
	go func() {
		defer close(checking)
		d.Inspect(long, "ctx/x", backend.Exclusive) // blocks in the table check until long ends
	}()
	time.Sleep(100 * time.Millisecond)

	calls := []struct {
		name string
		f    func(context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error { _, err := d.TryAcquire(ctx, l); return err }},
		{"Refresh", func(ctx context.Context) error { return d.Refresh(ctx, l) }},
		{"RefreshMany", func(ctx context.Context) error { return d.RefreshMany(ctx, []backend.Claim{l})[0] }},
		{"Release", func(ctx context.Context) error { return d.Release(ctx, l) }},
		{"Subscribe", func(ctx context.Context) error {
			_, cancel, err := d.Subscribe(ctx, "ctx/y") // starts the listener, which cannot connect
			if err == nil {
				cancel()
			}
			return err
		}},
	}
	const wait = 100 * time.Millisecond
	for _, c := range calls {
		for _, how := range []string{"deadline", "cancel"} {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			if how == "deadline" {
				cancel()
				cctx, cancel = context.WithTimeout(ctx, wait)
			} else {
				time.AfterFunc(wait, cancel)
			}
			// Late is counted from when the context ended as a goroutine of
			// its own saw it, not from when it was meant to (a loaded
			// machine fires the deadline's timer, or runs the AfterFunc
			// cancel, late: that is not the call's lateness).
			ended := make(chan time.Time, 1)
			context.AfterFunc(cctx, func() { ended <- time.Now() })
			err := c.f(cctx)
			returned := time.Now()
			over := cctx.Err() != nil
			cancel()
			late := returned.Sub(<-ended)
			if !over {
				late = 0 // returned before its context ended
			}
			if err == nil {
				t.Errorf("%s (%s) succeeded cut off", c.name, how)
			}
			if late > backend.CancelGrace {
				t.Errorf("%s (%s) returned %v after its context ended, want at most %v: %v", c.name, how, late, backend.CancelGrace, err)
			}
		}
	}
	cancelLong()
	select {
	case <-checking:
	case <-time.After(backend.CancelGrace):
		t.Error("the table check did not return after its context ended")
	}
}

// A waiter cut off from the server, then cancelled, returns within
// CancelGrace.
func TestWaiterCutOffCancelled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p, purl := proxied(t, h.url)
	ctx := context.Background()
	holder, err := locker.Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := locker.Open(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	held, err := holder.TryAcquire(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(wctx, "w")
		if err == nil {
			l.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // waiting, subscribed
	p.Blackhole()
	time.Sleep(300 * time.Millisecond) // its next try hangs
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Acquire returned %v, want context.Canceled", err)
		}
		if took := time.Since(start); took > backend.CancelGrace {
			t.Errorf("Acquire returned %v after cancel, want at most %v", took, backend.CancelGrace)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire still waits 5s after cancel")
	}
}
