package locker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

func newClient(t testing.TB, s *memlock.Store, opts ...locker.Option) *locker.Client {
	t.Helper()
	return newClientOn(t, memDriver(s), opts...)
}

// memDriver is memlock.New on s, which fails only for a nil s.
func memDriver(s *memlock.Store) *memlock.Driver {
	d, err := memlock.New(s)
	if err != nil {
		panic(err)
	}
	return d
}

func newClientOn(t testing.TB, d backend.Driver, opts ...locker.Option) *locker.Client {
	t.Helper()
	c, err := locker.New(d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTokenNeverPrintedWhole(t *testing.T) {
	var logs bytes.Buffer
	c := newClient(t, memlock.NewStore(), locker.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	l, err := c.TryAcquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	tok := l.Token()
	if len(tok) != 32 {
		t.Fatalf("token %d hex digits, want 32 (128 bits)", len(tok))
	}
	slog.New(slog.NewTextHandler(&logs, nil)).Info("held", "token", tok)
	printed := fmt.Sprintf("%s %v %q %+v %#v %x", tok, tok, tok, tok, tok, tok) + logs.String()
	if strings.Contains(printed, string(tok)) || strings.Contains(printed, string(tok[8:])) {
		t.Fatalf("the whole token shows in %q", printed)
	}
}

func TestFailingRandomSourceIsAnError(t *testing.T) {
	s := memlock.NewStore()
	c := newClient(t, s, locker.WithRandom(iotest.ErrReader(errors.New("entropy gone"))))
	_, err := c.TryAcquire(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "entropy gone") {
		t.Fatalf("TryAcquire with a failing random source = %v, want its error", err)
	}
	// Nothing was taken.
	if _, err := newClient(t, s).TryAcquire(context.Background(), "x"); err != nil {
		t.Fatalf("the name is not free after the failed acquire: %v", err)
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		want error
		text string
	}{
		{"nosuch://host", locker.ErrInvalidURL, "import"},
		{"mem://?bogus=1", locker.ErrInvalidURL, "bogus"},
		{"mem://?namespace=a/b", locker.ErrInvalidName, "namespace"},
		{"mem://?ttl=banana", locker.ErrInvalidURL, "ttl"},
		{"mem://?ttl=-1s", locker.ErrInvalidTTL, ""},
		{"no scheme", locker.ErrInvalidURL, "scheme"},
		{"redis://user:s3cret@host:port:bad", locker.ErrInvalidURL, ""},
	} {
		_, err := locker.Open(ctx, tc.url)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("Open(%q) = %v, want %v mentioning %q", tc.url, err, tc.want, tc.text)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q) error shows the password: %v", tc.url, err)
		}
	}
	a, err := locker.Open(ctx, "mem://open-test?namespace=app-a&ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := locker.Open(ctx, "mem://open-test?namespace=app-b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	la, err := a.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if la.TTL() != 2*time.Second {
		t.Errorf("ttl parameter: lock TTL %v, want 2s", la.TTL())
	}
	if _, err := b.TryAcquire(ctx, "job"); err != nil {
		t.Errorf("another namespace on the same store collides: %v", err)
	}
	if _, err := locker.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestSameReentrantKeyConcurrentFirstAcquire(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	const n = 16
	locks := make([]*locker.Lock, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			l, err := c.Acquire(ctx, "x", locker.Reentrant("o"))
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			locks[i] = l
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, l := range locks[1:] {
		if l.Fence() != locks[0].Fence() {
			t.Fatalf("fences %d and %d: all %d acquisitions should share one hold", l.Fence(), locks[0].Fence(), n)
		}
	}
	for i, l := range locks {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	if _, err := c.TryAcquire(ctx, "x"); err != nil {
		t.Fatalf("free after the last release: %v", err)
	}
}

func TestDoReleasesOnPanicAndReturnsFnError(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not propagate")
			}
		}()
		c.Do(ctx, "x", func(context.Context) error { panic("boom") })
	}()
	boom := errors.New("boom")
	if err := c.Do(ctx, "x", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if _, err := c.TryAcquire(ctx, "x"); err != nil {
		t.Fatalf("Do left the lock held: %v", err)
	}
}

// flaky fails every Refresh with a network-style error while down is set.
type flaky struct {
	*memlock.Driver
	down      atomic.Bool
	refreshes atomic.Int32
}

func (f *flaky) Refresh(ctx context.Context, l backend.Claim) error {
	f.refreshes.Add(1)
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return f.Driver.Refresh(ctx, l)
}

func TestWatchdogRetriesUntilTTLThenLoses(t *testing.T) {
	ctx := context.Background()
	// A refresh every TTL/3, a retry every TTL/10: 1s leaves the retry
	// after a short outage more than half a second before the deadline.
	const ttl = time.Second
	f := &flaky{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, f)

	// An outage shorter than the TTL costs nothing. It lasts until a
	// refresh has failed, not for a set time that a loaded machine may
	// oversleep into the deadline.
	l, err := c.TryAcquire(ctx, "x", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	for deadline := time.Now().Add(5 * time.Second); f.refreshes.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no refresh within 5s")
		}
	}
	f.down.Store(false)
	time.Sleep(ttl)
	if err := l.Err(); err != nil {
		t.Fatalf("lost after a short outage: %v", err)
	}

	// A longer one loses the lock at the end of the TTL, not before, and
	// the watchdog retries meanwhile.
	f.down.Store(true)
	before := f.refreshes.Load()
	start := time.Now()
	select {
	case <-l.Lost():
		took := time.Since(start)
		if took > ttl+500*time.Millisecond {
			t.Errorf("lost %v after the outage began, TTL %v", took, ttl)
		}
		if !errors.Is(l.Err(), locker.ErrLost) || !strings.Contains(l.Err().Error(), "connection refused") {
			t.Errorf("Err = %v, want ErrLost with the refresh error", l.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not lost during a long outage")
	}
	if n := f.refreshes.Load() - before; n < 2 {
		t.Errorf("%d refreshes during the outage: the watchdog should retry", n)
	}
}

// batchCounter counts refresh calls and the locks they carry.
type batchCounter struct {
	*memlock.Driver
	calls, locks atomic.Int64
}

func (b *batchCounter) Refresh(ctx context.Context, l backend.Claim) error {
	b.calls.Add(1)
	b.locks.Add(1)
	return b.Driver.Refresh(ctx, l)
}

func (b *batchCounter) RefreshMany(ctx context.Context, ls []backend.Claim) []error {
	b.calls.Add(1)
	b.locks.Add(int64(len(ls)))
	return b.Driver.RefreshMany(ctx, ls)
}

func TestTenThousandLocksRefreshInBatches(t *testing.T) {
	ctx := context.Background()
	d := &batchCounter{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, d)
	before := runtime.NumGoroutine()
	const n, ttl = 10000, 2 * time.Second // generous: CI's two cores are busy
	var held []*locker.Lock
	for i := range n {
		l, err := c.TryAcquire(ctx, fmt.Sprint("lock-", i), locker.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	time.Sleep(2 * ttl) // about six refresh rounds
	if after := runtime.NumGoroutine(); after-before > 64 {
		t.Errorf("%d goroutines for %d held locks", after-before, n)
	}
	calls, locks := d.calls.Load(), d.locks.Load()
	if locks < 2*n {
		t.Errorf("%d locks refreshed in %v, want at least %d", locks, 2*ttl, 2*n)
	}
	if calls*20 > locks {
		t.Errorf("%d refresh calls for %d lock refreshes: want batches of 20 or more on average", calls, locks)
	}
	t.Logf("%d locks: %d refreshes in %d calls", n, locks, calls)
	for _, l := range held {
		if l.Err() != nil {
			t.Fatalf("lost: %v", l.Err())
		}
	}
}

// BenchmarkHeldLock reports the memory one held, auto-refreshed lock costs.
func BenchmarkHeldLock(b *testing.B) {
	ctx := context.Background()
	c := newClient(b, memlock.NewStore())
	names := make([]string, b.N)
	for i := range names {
		names[i] = fmt.Sprint("lock-", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.TryAcquire(ctx, names[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// blinking fails every TryAcquire with a network-style error until up.
type blinking struct {
	*memlock.Driver
	up    atomic.Bool
	tries atomic.Int32
}

func (b *blinking) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	b.tries.Add(1)
	if !b.up.Load() {
		return backend.Grant{}, errors.New("connection reset")
	}
	return b.Driver.TryAcquire(ctx, l)
}

func TestAcquireWaitsThroughABlip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &blinking{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, b)
	time.AfterFunc(300*time.Millisecond, func() { b.up.Store(true) })
	if _, err := c.Acquire(ctx, "x"); err != nil {
		t.Fatalf("Acquire across a 300ms outage: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	b.up.Store(false)
	if _, err := c.TryAcquire(ctx, "z"); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("TryAcquire during an outage = %v, want the error at once", err)
	}

	start := time.Now()
	_, err := c.Acquire(ctx, "z")
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("Acquire during a long outage = %v, want the store's error", err)
	}
	if took := time.Since(start); took < 5*time.Second || took > 8*time.Second {
		t.Fatalf("Acquire gave up after %v, want about 5s", took)
	}
}

// refusing refuses every acquisition for a reason other than a holder.
type refusing struct{ backend.Driver }

func (refusing) TryAcquire(context.Context, backend.Claim) (backend.Grant, error) {
	return backend.Grant{}, fmt.Errorf("refusing: try-acquire: %w", &backend.NotAcquiredError{Reason: "the server is warming up"})
}

// A driver's reason for not granting reaches the caller once, and the
// error is still ErrNotAcquired; a plain refusal says only that.
func TestNotAcquiredReasonIsPassedOn(t *testing.T) {
	c := newClientOn(t, refusing{memDriver(memlock.NewStore())})
	_, err := c.TryAcquire(context.Background(), "x")
	if !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "warming up") ||
		strings.Count(err.Error(), "not acquired") != 1 || strings.Contains(err.Error(), "refusing:") {
		t.Fatalf("TryAcquire = %v, want ErrNotAcquired with the reason, said once", err)
	}
	s := memlock.NewStore()
	held := newClient(t, s, locker.WithLabel("host-a"))
	if _, err := held.TryAcquire(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	_, err = newClient(t, s).TryAcquire(context.Background(), "x")
	if want := `locker: try-acquire "x": not acquired (held by "host-a", fence 1)`; err == nil || err.Error() != want {
		t.Fatalf("TryAcquire of a held name = %v, want %q", err, want)
	}
}
