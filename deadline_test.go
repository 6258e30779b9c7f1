package locker_test

// The Client's own clock decides when a lock is lost, whatever the store or
// its client library is doing; these tests give it drivers that hang, lie
// about sessions or grant late.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// hanging refreshes nothing: every Refresh blocks, ignoring its context,
// until the test ends, like a client library waiting out its own timeout
// on a blackholed connection.
type hanging struct {
	backend.Driver
	stop chan struct{}
	in   atomic.Int32
}

func (h *hanging) Refresh(ctx context.Context, l backend.Claim) error {
	h.in.Add(1)
	<-h.stop
	return context.DeadlineExceeded
}

// lostAfter waits for l's Lost and returns when it was seen, and how long
// after a timer of this goroutine's for at woke it (zero if Lost came
// first): whatever delays every timer and goroutine on a loaded machine,
// the watchdog's included, delays that timer too, and is not the
// library's lateness. It fails t with never if Lost has not fired 5s
// after that timer.
func lostAfter(t *testing.T, l *locker.Lock, at time.Time, never string) (seen time.Time, lag time.Duration) {
	t.Helper()
	ref := time.NewTimer(time.Until(at))
	defer ref.Stop()
	select {
	case <-l.Lost():
		return time.Now(), 0
	case <-ref.C:
	}
	woke := time.Now()
	select {
	case <-l.Lost():
		return time.Now(), time.Since(woke)
	case <-time.After(5 * time.Second):
		t.Fatal(never)
		return time.Time{}, 0
	}
}

func TestLostFiresAtTheDeadlineWhileARefreshHangs(t *testing.T) {
	d := &hanging{Driver: memDriver(memlock.NewStore()), stop: make(chan struct{})}
	c := newClientOn(t, d)
	defer close(d.stop) // runs before c.Close, which waits for the refresh
	const ttl = 600 * time.Millisecond
	start := time.Now()
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	seen, lag := lostAfter(t, l, l.Deadline(), "lost never fired while the refresh hung")
	took := seen.Sub(start)
	deadline := ttl - backend.ClockMargin(ttl)
	if lag > 100*time.Millisecond {
		t.Fatalf("lost fired %v after a timer of the test's for its deadline (%v after the acquisition was sent)", lag, deadline)
	}
	if took < deadline {
		t.Fatalf("lost fired %v after the acquisition, before its deadline %v", took, deadline)
	}
	if d.in.Load() == 0 {
		t.Fatal("no refresh was attempted")
	}
	if !errors.Is(l.Err(), locker.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
}

// starved is a slow store: the refreshes of locks labelled "h" answer with
// an error, the first one just late enough that the watchdog's retry
// falls due shortly before the lock's deadline (set by the test); every
// other lock's refresh hangs until the test ends, so that the watchdog
// has its most refreshes in flight.
type starved struct {
	backend.Driver
	stop     chan struct{}
	first    chan struct{} // closed at the first refresh of "h"
	deadline atomic.Int64  // the deadline of "h", in Unix nanoseconds
	ttl      time.Duration // of "h"
	calls    atomic.Int32
}

func (d *starved) Refresh(ctx context.Context, l backend.Claim) error {
	if l.Owner != "h" {
		<-d.stop
		return context.DeadlineExceeded
	}
	if d.calls.Add(1) == 1 {
		close(d.first)
		// The watchdog retries TTL/10 after a failure: here 40 ms before
		// the deadline.
		time.Sleep(time.Until(time.Unix(0, d.deadline.Load()).Add(-d.ttl/10 - 40*time.Millisecond)))
	}
	return errors.New("read: connection reset by peer")
}

// TestLostFiresAtTheDeadlineWhileRefreshesQueue: a lock whose refresh is
// put off because the watchdog has its most refreshes in flight is still
// lost at its deadline, not at the next try after it.
func TestLostFiresAtTheDeadlineWhileRefreshesQueue(t *testing.T) {
	t.Parallel()
	const ttl = 4 * time.Second
	d := &starved{Driver: memDriver(memlock.NewStore()), stop: make(chan struct{}), first: make(chan struct{}), ttl: ttl}
	c := newClientOn(t, d)
	defer close(d.stop) // runs before c.Close, which waits for the refreshes
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "x", locker.TTL(ttl), locker.Label("h"))
	if err != nil {
		t.Fatal(err)
	}
	d.deadline.Store(l.Deadline().UnixNano())
	<-d.first
	for i := range 64 { // the watchdog's bound on refreshes in flight
		if _, err := c.TryAcquire(ctx, fmt.Sprint("b", i), locker.TTL(3*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	_, lag := lostAfter(t, l, l.Deadline(), "lost never fired while refreshes queued")
	if lag > 100*time.Millisecond {
		t.Fatalf("lost fired %v after a timer of the test's for its deadline", lag)
	}
}

// session reports a session whose last answered request the test sets.
type session struct {
	backend.Driver
	ttl     time.Duration // the session's timeout; zero: the lock's TTL
	mu      sync.Mutex
	contact time.Time
}

func (s *session) SessionTTL() time.Duration { return time.Second }

func (s *session) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	s.set(time.Now())
	g, err := s.Driver.TryAcquire(ctx, l)
	g.Contact, g.SessionTTL = s.last, s.ttl
	return g, err
}

func (s *session) set(t time.Time) {
	s.mu.Lock()
	s.contact = t
	s.mu.Unlock()
}

func (s *session) last() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contact
}

func TestSessionLockLostWhenContactStops(t *testing.T) {
	d := &session{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, d)
	const ttl = 500 * time.Millisecond
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Answered requests every 100 ms keep it for a while... (unless this
	// goroutine slept late past the session's deadline: then it may be
	// lost, and the test tells nothing)
	for range 8 {
		time.Sleep(100 * time.Millisecond)
		now := time.Now()
		if gap := now.Sub(d.last()); gap >= ttl-backend.ClockMargin(ttl) {
			t.Skipf("inconclusive: the session went %v without an answer, past its timeout: this machine ran the test too late", gap)
		}
		d.set(now)
	}
	select {
	case <-l.Lost():
		t.Fatalf("lost while the session was answered: %v", l.Err())
	default:
	}
	// ...then the store stops answering.
	last := d.last()
	deadline := last.Add(ttl - backend.ClockMargin(ttl))
	seen, lag := lostAfter(t, l, deadline, "lost never fired after the session went silent")
	if late := seen.Sub(deadline); lag > 100*time.Millisecond || late < 0 {
		t.Fatalf("lost fired %v after the session's deadline, %v after a timer of the test's for it", late, lag)
	}

	// A session the driver knows ended loses its locks at once.
	l2, err := c.TryAcquire(context.Background(), "y", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	d.set(time.Time{})
	select {
	case <-l2.Lost():
	case <-time.After(2 * ttl):
		t.Fatal("lost never fired after the session ended")
	}
}

func TestIdleLocksCostNoCPU(t *testing.T) {
	c := newClient(t, memlock.NewStore())
	const ttl = 3 * time.Second
	var locks []*locker.Lock
	for i := range 200 {
		opts := []locker.LockOption{locker.TTL(ttl), locker.AutoRefresh(i%2 == 0)}
		l, err := c.TryAcquire(context.Background(), string(rune('a'+i%26))+string(rune('0'+i)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	before := cpuTime(t)
	// The unrefreshed half reaches its deadline at 3 s; the other half is
	// refreshed 9 times meanwhile.
	last := locks[len(locks)-1]
	select {
	case <-last.Lost():
	case <-time.After(2 * ttl):
		t.Fatal("the unrefreshed lock was never declared lost")
	}
	used := cpuTime(t) - before
	t.Logf("%v of CPU for 200 locks over %v", used, ttl)
	// A watchdog that spins in the last twelfth of the TTL burns 250 ms.
	if used > 100*time.Millisecond {
		t.Fatalf("idle locks used %v of CPU in %v", used, ttl)
	}
}

func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// conflicting fails a Refresh that overlaps another of the same lock, as a
// store that checks versions would.
type conflicting struct {
	backend.Driver
	in, calls atomic.Int32
}

func (d *conflicting) Refresh(ctx context.Context, l backend.Claim) error {
	d.calls.Add(1)
	if d.in.Add(1) > 1 {
		d.in.Add(-1)
		return errors.New("the lock item kept changing")
	}
	defer d.in.Add(-1)
	time.Sleep(5 * time.Millisecond)
	return d.Driver.Refresh(ctx, l)
}

func TestConcurrentReentriesShareOneRefresh(t *testing.T) {
	d := &conflicting{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, d)
	ctx := context.Background()
	outer, err := c.Acquire(ctx, "x", locker.Reentrant("job"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 8 {
		wg.Go(func() {
			for range 20 {
				l, err := c.Acquire(ctx, "x", locker.Reentrant("job"))
				if err != nil {
					failed.Add(1)
					t.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := d.calls.Load(); n >= 160 {
		t.Errorf("%d refreshes for 160 re-entries: none shared", n)
	}
	t.Logf("%d refreshes for 160 re-entries, %d failed", d.calls.Load(), failed.Load())
}

// late grants every TryAcquire in the store, then reports its caller's
// context error if that ended meanwhile: a reply that came too late.
type late struct {
	backend.Driver
	delay time.Duration
}

func (d *late) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	time.Sleep(d.delay)
	g, err := d.Driver.TryAcquire(context.Background(), l)
	if err == nil && ctx.Err() != nil {
		return backend.Grant{}, ctx.Err()
	}
	return g, err
}

func TestGrantAfterCancelIsReleased(t *testing.T) {
	s := memlock.NewStore()
	c := newClientOn(t, &late{Driver: memDriver(s), delay: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := c.TryAcquire(ctx, "x", locker.TTL(time.Minute)); err == nil {
		t.Fatal("TryAcquire succeeded after its context ended")
	}
	other := newClient(t, s)
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer wcancel()
	l, err := other.Acquire(wctx, "x", locker.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the grant made after the caller gave up still holds the name: %v", err)
	}
	_ = l.Release(context.Background())
}

// stuck never answers a Release, but honours its context.
type stuck struct{ backend.Driver }

func (d stuck) Release(ctx context.Context, l backend.Claim) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestCloseIsBounded(t *testing.T) {
	c, err := locker.New(stuck{memDriver(memlock.NewStore())})
	if err != nil {
		t.Fatal(err)
	}
	var locks []*locker.Lock
	for i := range 300 {
		l, err := c.TryAcquire(context.Background(), string(rune('a'+i%26))+string(rune('0'+i)))
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v with a store that never answers", took)
	}
	for _, l := range locks {
		if !errors.Is(l.Err(), locker.ErrClosed) {
			t.Fatalf("Err after Close = %v, want ErrClosed", l.Err())
		}
	}
}

// A Release in flight ends as Close begins, long before its own bound
// (10 s for this TTL).
func TestCloseEndsReleaseInFlight(t *testing.T) {
	entered := make(chan struct{}, 1)
	c, err := locker.New(stuckEntered{stuck{memDriver(memlock.NewStore())}, entered})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(context.Background()) }()
	<-entered
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		c.Close()
	}()
	defer func() { <-closed }()
	select {
	case err := <-released:
		if err == nil {
			t.Fatal("a Release that Close cut short reported success")
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("Release returned %v after Close began", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the Release in flight")
	}
}

// stuckEntered is stuck that says when a Release enters it.
type stuckEntered struct {
	stuck
	entered chan struct{}
}

func (d stuckEntered) Release(ctx context.Context, l backend.Claim) error {
	select {
	case d.entered <- struct{}{}:
	default:
	}
	return d.stuck.Release(ctx, l)
}

func TestSessionShorterThanTTLCounts(t *testing.T) {
	const sessionTTL = 400 * time.Millisecond
	d := &session{Driver: memDriver(memlock.NewStore()), ttl: sessionTTL}
	c := newClientOn(t, d)
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	last := d.last()
	deadline := last.Add(sessionTTL - backend.ClockMargin(sessionTTL))
	seen, lag := lostAfter(t, l, deadline, "lost never fired: the lock's 30 s TTL was taken for the 400 ms session's")
	if lag > 100*time.Millisecond {
		t.Fatalf("lost fired %v after the session's deadline, %v after a timer of the test's for it", seen.Sub(deadline), lag)
	}
}

// Deadline is the Client's own deadline: set by the acquisition, a clock
// margin before the TTL ends, moved on by a refresh, and the moment Lost
// fires when refreshes hang.
func TestDeadlineMovesWithRefreshes(t *testing.T) {
	d := &hanging{Driver: memDriver(memlock.NewStore()), stop: make(chan struct{})}
	c := newClient(t, memlock.NewStore())
	const ttl = 600 * time.Millisecond
	before := time.Now()
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	first := l.Deadline()
	margin := backend.ClockMargin(ttl)
	if first.Before(before.Add(ttl-margin)) || first.After(after.Add(ttl-margin)) {
		t.Fatalf("Deadline %v after the acquisition, want %v", first.Sub(before), ttl-margin)
	}
	time.Sleep(50 * time.Millisecond)
	if err := l.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !l.Deadline().After(first) {
		t.Fatalf("Deadline did not move on with a refresh: %v, then %v", first, l.Deadline())
	}

	c = newClientOn(t, d)
	defer close(d.stop)
	l, err = c.TryAcquire(context.Background(), "y", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	until := l.Deadline()
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("lost never fired while the refresh hung")
	}
	if lost := time.Now(); lost.Before(until) {
		t.Fatalf("lost %v before Deadline", until.Sub(lost))
	}
}

// queued sends each grant late, after a wait of its own in the process
// (SQLite's write gate), and says when it sent it (Grant.Sent).
type queued struct {
	backend.Driver
	sent time.Time
}

func (q *queued) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	time.Sleep(50 * time.Millisecond)
	q.sent = time.Now()
	g, err := q.Driver.TryAcquire(ctx, l)
	g.Sent = q.sent
	return g, err
}

// A grant's TTL counts from when the driver sent it, not from the call:
// a wait in the process before the store saw the request is not spent
// of the lock's life.
func TestDeadlineCountsFromGrantSent(t *testing.T) {
	d := &queued{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, d)
	const ttl = time.Minute
	l, err := c.TryAcquire(context.Background(), "x", locker.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if want := d.sent.Add(ttl - backend.ClockMargin(ttl)); l.Deadline().Before(want) {
		t.Fatalf("deadline %v before the grant was sent, %v, + TTL - margin = %v", l.Deadline(), d.sent, want)
	}
}

// grantAtClose grants at once and answers when its call's context ends
// (Close ends it): a grant that crossed the Client's closing. Its
// releases take a round trip.
type grantAtClose struct {
	*memlock.Driver
	granted chan struct{}
}

func (d grantAtClose) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, c)
	d.granted <- struct{}{}
	<-ctx.Done()
	return g, err
}

func (d grantAtClose) TryAcquireAll(ctx context.Context, cs []backend.Claim) ([]backend.Grant, error) {
	gs, err := d.Driver.TryAcquireAll(ctx, cs)
	d.granted <- struct{}{}
	<-ctx.Done()
	return gs, err
}

func (d grantAtClose) Release(ctx context.Context, c backend.Claim) error {
	time.Sleep(5 * time.Millisecond)
	return d.Driver.Release(ctx, c)
}

// A grant that arrives as the Client closes holds nothing once Close has
// returned: Close releases it before it closes the driver, as it does the
// Client's locks, for a lock and for a set.
func TestCloseReleasesGrantsInFlight(t *testing.T) {
	s := memlock.NewStore()
	obs := newClient(t, s)
	for _, set := range []bool{false, true} {
		d := grantAtClose{memDriver(s), make(chan struct{}, 1)}
		c, err := locker.New(d, locker.WithDefaultTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"a", "b"}
		done := make(chan error, 1)
		go func() {
			var err error
			if set {
				_, err = c.TryAcquireAll(context.Background(), names)
			} else {
				_, err = c.TryAcquire(context.Background(), names[0])
				names = names[:1]
			}
			done <- err
		}()
		<-d.granted
		c.Close()
		if err := <-done; !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("set %v: the call crossing Close = %v, want ErrClosed", set, err)
		}
		for _, n := range names {
			l, err := obs.TryAcquire(context.Background(), n)
			if err != nil {
				t.Fatalf("set %v: %s after Close returned: %v, want it free", set, n, err)
			}
			l.Release(context.Background())
		}
	}
}
