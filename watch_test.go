package locker_test

import (
	"context"
	"errors"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// subscribeCounter is a memlock driver that counts Subscribe calls.
type subscribeCounter struct {
	*memlock.Driver
	calls atomic.Int64
}

func (s *subscribeCounter) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	s.calls.Add(1)
	return s.Driver.Subscribe(ctx, key)
}

// silentDriver hides every optional interface of its driver, Notifier
// among them.
type silentDriver struct{ backend.Driver }

func badNames() map[string]string {
	return map[string]string{
		"empty":        "",
		"too long":     strings.Repeat("x", locker.MaxNameLen+1),
		"invalid UTF8": "lock-\xff",
		"NUL":          "lock\x00name",
	}
}

func TestWatchBadNameBeforeAnyCall(t *testing.T) {
	d := &subscribeCounter{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, d)
	for what, name := range badNames() {
		ch, stop, err := c.Watch(context.Background(), name)
		if !errors.Is(err, locker.ErrInvalidName) {
			t.Errorf("%s: Watch returned %v, want ErrInvalidName", what, err)
		}
		if ch != nil || stop != nil {
			t.Errorf("%s: Watch returned a channel or a stop with its error", what)
		}
	}
	if n := d.calls.Load(); n != 0 {
		t.Errorf("%d Subscribe call(s) for bad names", n)
	}
	// The counter counts: a good name subscribes once.
	_, stop, err := c.Watch(context.Background(), "good")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if n := d.calls.Load(); n != 1 {
		t.Errorf("%d Subscribe call(s) for one Watch, want 1", n)
	}
}

func TestWatchUnsupported(t *testing.T) {
	c := newClientOn(t, silentDriver{memDriver(memlock.NewStore())})
	ch, stop, err := c.Watch(context.Background(), "name")
	if !errors.Is(err, locker.ErrUnsupported) || ch != nil || stop != nil {
		t.Errorf("Watch on a driver without notifications: %v, %v, stop set %v; want ErrUnsupported", ch, err, stop != nil)
	}
	// A bad name is still a bad name there.
	if _, _, err := c.Watch(context.Background(), ""); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("bad name on a driver without notifications: %v, want ErrInvalidName", err)
	}
}

// noneLeft fails t if goroutines labeled watchtest=id still run after a
// second.
func noneLeft(t *testing.T, id, after string) {
	t.Helper()
	if left := testutil.LabeledAfter("watchtest", id, time.Second); len(left) > 0 {
		t.Errorf("%d goroutine(s) left after %s:\n%s", len(left), after, strings.Join(left, "\n\n"))
	}
}

func TestWatchStopIdempotentNoLeak(t *testing.T) {
	s := memlock.NewStore()
	// Watch, a release reported, stop twice: nothing left of the Watch.
	c := newClient(t, s)
	var ch <-chan struct{}
	var stop func()
	var err error
	pprof.Do(context.Background(), pprof.Labels("watchtest", "stop"), func(ctx context.Context) {
		ch, stop, err = c.Watch(ctx, "name")
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(context.Background(), "name")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no value within 5 s of a release")
	}
	stop()
	stop()
	noneLeft(t, "stop", "stop")
	// Stopped: a later release sends nothing.
	l, err = c.TryAcquire(context.Background(), "name")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Error("a value after stop")
	case <-time.After(100 * time.Millisecond):
	}

	// A Watch of a client that closes, its context cancelled after: the
	// client, its Watch and the cancellation leave nothing, and a stop
	// after Close is harmless.
	var c2 *locker.Client
	wctx, cancel := context.WithCancel(context.Background())
	pprof.Do(context.Background(), pprof.Labels("watchtest", "close"), func(context.Context) {
		c2, err = locker.New(memDriver(s))
		if err == nil {
			_, stop, err = c2.Watch(wctx, "name")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, "close", "Close")
	pprof.Do(context.Background(), pprof.Labels("watchtest", "close"), func(context.Context) { cancel() })
	stop()
	stop()
	noneLeft(t, "close", "Close, cancel and stop")
	if _, _, err := c2.Watch(context.Background(), "name"); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Watch after Close: %v, want ErrClosed", err)
	}
}
