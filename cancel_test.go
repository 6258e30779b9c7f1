package locker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// gated lets its first TryAcquire through, and holds every later one
// until proceed closes, as a request on the wire that a client library
// does not abandon when its context ends (it returns within a round trip,
// as the contract asks); it then says granted when the store granted it.
// Its releases take release, as a slow store's.
type gated struct {
	backend.Driver // no Notifier, no Waiter: the Client's own wait loop
	calls          atomic.Int32
	entered        chan struct{}
	proceed        chan struct{}
	granted        chan struct{}
	release        time.Duration
}

func (d *gated) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if d.calls.Add(1) == 1 {
		return d.Driver.TryAcquire(ctx, l)
	}
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-d.proceed
	g, err := d.Driver.TryAcquire(context.Background(), l)
	if err == nil {
		select {
		case d.granted <- struct{}{}:
		default:
		}
	}
	return g, err
}

func (d *gated) Release(ctx context.Context, l backend.Claim) error {
	time.Sleep(d.release)
	return d.Driver.Release(ctx, l)
}

// A waiter cancelled while its try is on the wire, a try that the store
// then grants, returns only once that grant is released (within
// CancelGrace): another client finds the name free as soon as the call has
// returned. The Client used to return at once and release the grant in
// the background, after the call had returned.
func TestCancelledWaitReleasesLateGrantBeforeReturning(t *testing.T) {
	s := memlock.NewStore()
	d := &gated{Driver: memDriver(s), entered: make(chan struct{}, 1), proceed: make(chan struct{}),
		granted: make(chan struct{}, 1), release: 20 * time.Millisecond}
	waiter := newClientOn(t, d, locker.WithBackoff(time.Millisecond, 2*time.Millisecond))
	holder, other := newClient(t, s), newClient(t, s)
	ctx := context.Background()
	h, err := holder.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(wctx, "x")
		if err == nil {
			l.Release(ctx)
			err = errors.New("the cancelled Acquire returned a lock")
		}
		done <- err
	}()
	select {
	case <-d.entered: // the waiter's second try is on the wire
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not try again within 5s")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(10 * time.Millisecond) // the Client sees its context end
	proceeded := time.Now()
	close(d.proceed)
	err = <-done
	returned := time.Since(proceeded)
	if !errors.Is(err, locker.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v, want ErrNotAcquired and Canceled", err)
	}
	select {
	case <-d.granted:
	case <-time.After(5 * time.Second):
		t.Fatal("the store never granted the try on the wire")
	}
	l, err := other.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatalf("the cancelled Acquire returned (%v after its try was let through), and the name is still held: %v", returned.Round(time.Millisecond), err)
	}
	l.Release(ctx)
	if returned > backend.CancelGrace+time.Second {
		t.Fatalf("the cancelled Acquire returned %v after its try was let through", returned)
	}
}
