package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// A case of the suite. Serial cases check goroutine leaks and run alone.
type testCase struct {
	name   string
	serial bool
	run    func(*suite, *testing.T)
}

// cases is the whole suite, in the order it runs.
var cases = []testCase{
	{"CloseReleasesAndLeavesNoGoroutine", true, (*suite).close},
	{"CancelledWaitLeavesNoGoroutine", true, (*suite).cancelNoGoroutine},
	{"WatchReportsEveryRelease", true, (*suite).watchReports},
	{"LockSetServerFailsMidway", true, (*suite).lockSetMidway},

	{"SecondAcquirerRefused", false, (*suite).secondRefused},
	{"IndependentNames", false, (*suite).independentNames},
	{"ReacquireAfterRelease", false, (*suite).reacquire},
	{"ConcurrentTryAcquireOneWinner", false, (*suite).oneWinner},
	{"WaiterWakesAfterRelease", false, (*suite).waiterWakes},
	{"LongWaitKeepsLock", false, (*suite).longWait},
	{"CancelReturnsPromptly", false, (*suite).cancelPrompt},
	{"CancelLeavesNoEntry", false, (*suite).cancelNoEntry},
	{"CancelledAcquireLeavesNameFree", false, (*suite).cancelCrossed},
	{"ExpiresAfterTTL", false, (*suite).expiresAfterTTL},
	{"LostBeforeTakeover", false, (*suite).lostBeforeTakeover},
	{"OldHolderCannotTouchNewHolder", false, (*suite).oldHolder},
	{"ForgedTokenChangesNothing", false, (*suite).forgedToken},
	{"DoubleReleaseNotHeld", false, (*suite).doubleRelease},
	{"RefreshExtends", false, (*suite).refreshExtends},
	{"WatchdogKeepsLock", false, (*suite).watchdog},
	{"LostSignalFires", false, (*suite).lostSignal},
	{"DoCancelsOnLoss", false, (*suite).doCancels},
	{"ReentrantThreeDeep", false, (*suite).reentrant},
	{"ReentryExtendsTTL", false, (*suite).reentryExtends},
	{"ReentryAfterLossFails", false, (*suite).reentryAfterLoss},
	{"FencesIncrease", false, (*suite).fencesIncrease},
	{"FencesIncreaseAcrossExpiry", false, (*suite).fencesAcrossExpiry},
	{"CounterUnderContention", false, (*suite).counter},
	{"BadInputTypedErrors", false, (*suite).badInput},
	{"AnyValidNameWorks", false, (*suite).validNames},
	{"FIFOWaiters", false, (*suite).fifo},
	{"WaitRidesOutStoreOutage", false, (*suite).ridesOutOutage},
	{"WaitGivesUpAfterFailureBudget", false, (*suite).givesUpAfterBudget},
	{"ForgetsReleasedNames", false, (*suite).forgetsReleased},
	{"InspectReportsHolderAndQueue", false, (*suite).inspectReports},
	{"ListFindsHeldLocks", false, (*suite).listFinds},
	{"ForceReleaseFencesAndSignals", false, (*suite).forceRelease},
	{"MinHoldOutlivesRelease", false, (*suite).minHold},
	{"SharedLabelExcludes", false, (*suite).sharedLabel},
	{"ReleaseAfterCancelFreesName", false, (*suite).releaseAfterCancel},
	{"LockSetAllOrNothing", false, (*suite).lockSetAllOrNothing},
	{"LockSetCrossedOrders", false, (*suite).lockSetCrossedOrders},
	{"LockSetLost", false, (*suite).lockSetLost},
	{"LockSetManyNames", false, (*suite).lockSetMany},
	{"LockSetOneGone", false, (*suite).lockSetOneGone},
	{"LockSetCancelledLeavesNamesFree", false, (*suite).lockSetCancelled},
	{"LockDelayAfterLoss", false, (*suite).lockDelay},

	{"SemaphoreAtMostLimit", false, (*suite).semAtMostLimit},
	{"SemaphoreLimitAndMismatch", false, (*suite).semLimit},
	{"SemaphoreCutHolderLosesFirst", false, (*suite).semCutHolder},
	{"SemaphoreForgedTokenChangesNothing", false, (*suite).semForged},
	{"SemaphoreCancelLeavesNoEntry", false, (*suite).semCancel},
	{"SemaphoreWaiterWakes", false, (*suite).semWaiterWakes},
	{"SemaphoreFencesIncrease", false, (*suite).semFences},
	{"SemaphoreFIFOWaiters", false, (*suite).semFIFO},
	{"SemaphoreWeightsAtMostLimit", false, (*suite).semWeightsAtMostLimit},
	{"SemaphoreWeightsRefused", false, (*suite).semWeightsRefused},
	{"SemaphoreWeightsFIFO", false, (*suite).semWeightsFIFO},
	{"SemaphoreHoldersSeenAndBroken", false, (*suite).semHolders},
	{"SemaphoreResized", false, (*suite).semResize},
	{"RWReadersShareWriterExcludes", false, (*suite).rwShare},
	{"RWCounterUnderContention", false, (*suite).rwCounter},
	{"RWWriterNotStarved", false, (*suite).rwNotStarved},
	{"RWFencesIncrease", false, (*suite).rwFences},
	{"RWCancelledWriterLeavesNothing", false, (*suite).rwCancel},
	{"RWWaitersWake", false, (*suite).rwWakes},
	{"RWForgedTokenChangesNothing", false, (*suite).rwForged},
	{"RWCutHolderLosesFirst", false, (*suite).rwCutHolder},
	{"RWHoldersSeenAndBroken", false, (*suite).rwHolders},
}

// Run runs the suite against h's store.
func Run(t *testing.T, h Harness) {
	tr := h.Traits()
	if tr.TTL <= 0 {
		tr.TTL = 500 * time.Millisecond
	}
	var b [4]byte
	rand.Read(b[:])
	s := &suite{h: h, tr: tr, ns: "conformance-" + hex.EncodeToString(b[:])}
	t.Run("Serial", func(t *testing.T) {
		for _, c := range cases {
			if c.serial {
				t.Run(c.name, func(t *testing.T) { c.run(s, t) })
			}
		}
	})
	t.Run("Parallel", func(t *testing.T) {
		for _, c := range cases {
			if !c.serial {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(s, t)
				})
			}
		}
	})
}

type suite struct {
	h  Harness
	tr Traits
	ns string
}

// ttl is the TTL every case uses; slack is how late the store may free a
// lock past it, plus room for a busy machine.
func (s *suite) ttl() time.Duration   { return s.tr.TTL }
func (s *suite) slack() time.Duration { return s.tr.Granularity + s.tr.TTL/2 + time.Second }

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// client returns a new Client on its own driver, closed at cleanup.
func (s *suite) client(t *testing.T) *locker.Client {
	t.Helper()
	c, _ := s.clientDriver(t)
	return c
}

func (s *suite) clientDriver(t *testing.T, opts ...locker.Option) (*locker.Client, backend.Driver) {
	t.Helper()
	drv, err := s.h.NewDriver(s.ctx(t))
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	drv = wrapped{drv}
	opts = append([]locker.Option{locker.WithNamespace(s.ns), locker.WithDefaultTTL(s.ttl())}, opts...)
	c, err := locker.New(drv, opts...)
	if err != nil {
		drv.Close()
		t.Fatalf("locker.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, drv
}

// wrapped is the plainest wrapper of a driver, as a user's metrics or
// tracing wrapper would be: every case runs through it, which proves that
// the Client still finds the driver's optional interfaces (queue, session,
// notifications, batches) through backend.Wrapper.
type wrapped struct{ backend.Driver }

func (w wrapped) Unwrap() backend.Driver { return w.Driver }

// name returns a lock name unique to the test, with the characters stores
// find awkward, so every case also checks encoding.
func (s *suite) name(t *testing.T, suffix string) string {
	return t.Name() + " ü/../" + suffix
}

func (s *suite) key(name string) string { return backend.Key(s.ns, name) }

// isSession reports whether c's locks live in a server-side session.
func (s *suite) isSession(c *locker.Client) bool {
	_, ok := backend.As[backend.Session](c.Driver())
	return ok
}

func mustAcquire(t *testing.T, ctx context.Context, c *locker.Client, name string, opts ...locker.LockOption) *locker.Lock {
	t.Helper()
	l, err := c.TryAcquire(ctx, name, opts...)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}

func mustRefuse(t *testing.T, ctx context.Context, c *locker.Client, name, why string, opts ...locker.LockOption) {
	t.Helper()
	l, err := c.TryAcquire(ctx, name, opts...)
	if err == nil {
		l.Release(ctx)
		t.Fatalf("TryAcquire(%q) succeeded, but %s", name, why)
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired (%s)", name, err, why)
	}
}

func mustRelease(t *testing.T, ctx context.Context, l *locker.Lock) {
	t.Helper()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", l.Name(), err)
	}
}

// acquireWithin polls TryAcquire until it succeeds or d passes.
func acquireWithin(t *testing.T, ctx context.Context, c *locker.Client, name string, d time.Duration, opts ...locker.LockOption) *locker.Lock {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l, err := c.TryAcquire(ctx, name, opts...)
		if err == nil {
			return l
		}
		if !errors.Is(err, locker.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire(%q) did not succeed within %v: %v", name, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitLost(t *testing.T, l *locker.Lock, within time.Duration, what string) {
	t.Helper()
	select {
	case <-l.Lost():
		if err := l.Err(); !errors.Is(err, locker.ErrLost) {
			t.Fatalf("Lost fired, but Err() = %v, want ErrLost", err)
		}
	case <-time.After(within):
		t.Fatalf("Lost did not fire within %v after %s", within, what)
	}
}

func notLost(t *testing.T, l *locker.Lock) {
	t.Helper()
	select {
	case <-l.Lost():
		t.Fatalf("Lost fired on a lock still held: %v", l.Err())
	default:
	}
}

// The cases that let an unrefreshed lock run close to its deadline judge
// what they see by that deadline (Lock.Deadline: until then the library
// promises the lock held, in the store and for its holder), not by how
// long they meant to sleep: a loaded machine sleeps late, and past the
// deadline the lock may rightly be gone. A check answered past it proves
// nothing either way: the attempt is inconclusive, and another is made.

// attempts runs try, a case's checks on a name of attempt's own, until it
// is not inconclusive (it returns what came too late, or ""), at most 3
// times; three inconclusive attempts skip the case.
func attempts(t *testing.T, try func(attempt int) (late string)) {
	t.Helper()
	for i := 1; i <= 3; i++ {
		late := try(i)
		if late == "" {
			return
		}
		t.Logf("attempt %d inconclusive: %s", i, late)
	}
	t.Skip("three attempts inconclusive: this machine ran the case too late to tell")
}

// tooLate describes a check answered at or past until.
func tooLate(what string, answered, until time.Time) string {
	return fmt.Sprintf("%s was answered %v past the lock's deadline", what, answered.Sub(until).Round(time.Millisecond))
}

// refuseUntil is mustRefuse for a lock promised held until until: a grant
// answered before until fails the case; one answered later is returned as
// inconclusive.
func refuseUntil(t *testing.T, ctx context.Context, c *locker.Client, name string, until time.Time, why string, opts ...locker.LockOption) (late string) {
	t.Helper()
	l, err := c.TryAcquire(ctx, name, opts...)
	answered := time.Now()
	if err == nil {
		l.Release(ctx)
		if answered.Before(until) {
			t.Fatalf("TryAcquire(%q) succeeded %v before the holder's deadline, but %s", name, until.Sub(answered), why)
		}
		return tooLate("a TryAcquire that took the lock", answered, until)
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired (%s)", name, err, why)
	}
	return ""
}

// notLostUntil is notLost for a lock promised held until until.
func notLostUntil(t *testing.T, l *locker.Lock, until time.Time) (late string) {
	t.Helper()
	select {
	case <-l.Lost():
		at := time.Now()
		if at.Before(until) {
			t.Fatalf("Lost fired %v before the lock's deadline: %v", until.Sub(at), l.Err())
		}
		return tooLate("a look at Lost, which had fired,", at, until)
	default:
		return ""
	}
}

// okUntil fails t with what's err if it was answered before until; past
// it, err is returned as inconclusive.
func okUntil(t *testing.T, what string, err error, until time.Time) (late string) {
	t.Helper()
	if err == nil {
		return ""
	}
	if answered := time.Now(); !answered.Before(until) {
		return tooLate(fmt.Sprintf("%s that failed (%v)", what, err), answered, until)
	}
	t.Fatalf("%s: %v", what, err)
	return ""
}

// expire takes the lock away: through the harness for session backends,
// whose locks live as long as the session, else by waiting out the TTL.
func (s *suite) expire(t *testing.T, ctx context.Context, c *locker.Client, name string) {
	t.Helper()
	if s.isSession(c) {
		if err := s.h.Expire(ctx, s.key(name)); err != nil {
			t.Fatalf("Harness.Expire: %v", err)
		}
		return
	}
	time.Sleep(s.ttl())
}

func (s *suite) secondRefused(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	mustRefuse(t, ctx, c2, name, "another client holds it")
	mustRefuse(t, ctx, c1, name, "it is held by another holder of the same client")
	mustRelease(t, ctx, l)
}

func (s *suite) independentNames(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	base := s.name(t, "a")
	held := mustAcquire(t, ctx, c1, base)
	for _, other := range []string{base + "/b", base + "/", base + "b", strings.TrimSuffix(base, "a")} {
		l := mustAcquire(t, ctx, c2, other)
		mustRelease(t, ctx, l)
	}
	mustRelease(t, ctx, held)
}

func (s *suite) reacquire(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	name := s.name(t, "x")
	for i := range 10 {
		l, err := cs[i%2].TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: TryAcquire right after a release: %v", i, err)
		}
		mustRelease(t, ctx, l)
	}
}

func (s *suite) oneWinner(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	name := s.name(t, "x")
	const n = 8
	var wins atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			l, err := cs[i%2].TryAcquire(ctx, name)
			switch {
			case err == nil:
				wins.Add(1)
				_ = l // held until the test ends, so no later try can win
			case !errors.Is(err, locker.ErrNotAcquired):
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("TryAcquire: %v, want success or ErrNotAcquired", err)
	}
	if got := wins.Load(); got != 1 {
		t.Fatalf("%d concurrent TryAcquire calls won, want exactly 1", got)
	}
}

func (s *suite) waiterWakes(t *testing.T) {
	ctx := s.ctx(t)
	c1 := s.client(t)
	name := s.name(t, "x")
	s.wakes(t, ctx, name, mustAcquire(t, ctx, c1, name))
}

// longWait: a waiter that waited longer than the TTL gets a lock that lives
// a full TTL from when it was granted, not one already expired.
func (s *suite) longWait(t *testing.T) {
	ctx := s.ctx(t)
	arrived := make(arrivals, 1)
	c1, c3 := s.client(t), s.client(t)
	c2, _ := s.clientDriver(t, locker.WithObserver(&locker.Observer{
		AcquireStart: func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
			select {
			case arrived <- 0:
			default:
			}
			return nil
		},
	}))
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	got := make(chan *locker.Lock, 1)
	go func() {
		w, err := c2.Acquire(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- w
	}()
	// Two TTLs of waiting, from when the waiter called its Client (a
	// loaded machine may start its goroutine late); the watchdog keeps l
	// meanwhile.
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not call its Client within 10s")
	}
	time.Sleep(2 * l.TTL())
	mustRelease(t, ctx, l)
	w := <-got
	if w == nil {
		return
	}
	time.Sleep(l.TTL() / 2)
	notLost(t, w)
	mustRefuse(t, ctx, c3, name, "the waiter holds it")
	mustRelease(t, ctx, w)
}

func (s *suite) cancelPrompt(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)

	const wait = 300 * time.Millisecond
	dctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	_, err := c2.Acquire(dctx, name)
	took := time.Since(start)
	if !errors.Is(err, locker.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > wait+time.Second {
		t.Fatalf("Acquire returned %v after a %v deadline", took, wait)
	}

	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := c2.Acquire(cctx, name); done <- err }()
	time.Sleep(100 * time.Millisecond)
	cancelled := time.Now()
	ccancel()
	select {
	case err := <-done:
		if !errors.Is(err, locker.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire = %v, want ErrNotAcquired and Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatalf("cancelled Acquire still waiting %v after cancel", time.Since(cancelled))
	}
	mustRelease(t, ctx, l)
	// Nothing the cancelled waiters left behind stands in the way.
	mustRelease(t, ctx, acquireWithin(t, ctx, c2, name, s.slack()))
}

func (s *suite) cancelNoEntry(t *testing.T) {
	wc, ok := s.h.(WaiterCounter)
	if !ok {
		t.Skip("the harness does not implement WaiterCounter: the backend keeps no per-waiter entries to inspect")
	}
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	mustRefuse(t, ctx, c2, name, "it is held")
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c2.Acquire(dctx, name)
	cancel()
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Acquire past its deadline = %v, want ErrNotAcquired", err)
	}
	s.entriesSettle(t, ctx, wc, name, 1, "after a failed try and a cancelled wait (want the holder's alone)")
	mustRelease(t, ctx, l)
	if n, err := wc.Entries(ctx, s.key(name)); err != nil || n != 0 {
		t.Fatalf("after release, the store has %d entries for the key (err %v), want 0", n, err)
	}
}

// entriesSettle waits, up to 5s, until the store has want entries for
// name, and fails t if it does not. A cancelled call cleans up what it
// left in the store within backend.CancelGrace, and finishes in the
// background what takes longer, as a loaded machine may make it: the
// entries are right soon after it returns, not necessarily at once.
func (s *suite) entriesSettle(t *testing.T, ctx context.Context, wc WaiterCounter, name string, want int, when string) {
	t.Helper()
	var n int
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err = wc.Entries(ctx, s.key(name))
		if err == nil && n == want || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || n != want {
		t.Fatalf("%s, the store has %d entries for the key 5s later (err %v), want %d", when, n, err, want)
	}
}

func (s *suite) cancelNoGoroutine(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	// Warm up, so lazily started per-client machinery is not counted.
	l := mustAcquire(t, ctx, c1, name)
	w, err := func() (*locker.Lock, error) {
		go func() { time.Sleep(50 * time.Millisecond); l.Release(ctx) }()
		return c2.Acquire(ctx, name)
	}()
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	mustRelease(t, ctx, w)
	l = mustAcquire(t, ctx, c1, name)

	check := leakCheck(t, s.tr.IgnoreGoroutines)
	for range 3 {
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := c2.Acquire(dctx, name)
		cancel()
		if !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("Acquire past its deadline = %v, want ErrNotAcquired", err)
		}
	}
	check()
	mustRelease(t, ctx, l)
}

func (s *suite) expiresAfterTTL(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	if s.isSession(c1) {
		t.Skip("the driver is a backend.Session: its locks live as long as the client's session, and expire with it (OldHolderCannotTouchNewHolder expires them through Harness.Expire)")
	}
	name := s.name(t, "x")
	start := time.Now()
	l := mustAcquire(t, ctx, c1, name, locker.AutoRefresh(false))
	if l.TTL() < s.ttl() {
		t.Fatalf("effective TTL %v is shorter than the %v asked for", l.TTL(), s.ttl())
	}
	mustRefuse(t, ctx, c2, name, "it is held")
	l2 := acquireWithin(t, ctx, c2, name, l.TTL()+s.slack())
	if took := time.Since(start); took < l.TTL()*9/10 {
		t.Fatalf("the lock freed after %v, before its TTL of %v", took, l.TTL())
	}
	waitLost(t, l, time.Second, "the TTL ran out without a refresh")
	mustRelease(t, ctx, l2)
}

// lostBeforeTakeover checks the Client's deadline against the store's
// expiry: with no refresh, the holder is told it lost the lock before
// another client can take it, because the Client counts the TTL, less
// backend.ClockMargin, from when the request was sent, and the store from
// when it arrived. A store that frees a lock even slightly early, or a
// driver that reports a longer TTL than it stored, fails here.
func (s *suite) lostBeforeTakeover(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	if s.isSession(c1) {
		t.Skip("the driver is a backend.Session: its locks live as long as the client's session; the fault suite (internal/faults/) checks its deadline")
	}
	name := s.name(t, "x")
	start := time.Now()
	l := mustAcquire(t, ctx, c1, name, locker.AutoRefresh(false))
	// Look often only around the deadline, to keep the store's load low.
	time.Sleep(time.Until(start.Add(l.TTL() * 9 / 10)))
	giveUp := start.Add(l.TTL() + s.slack())
	for {
		l2, err := c2.TryAcquire(ctx, name)
		if err == nil {
			took := time.Since(start)
			if l.Err() == nil {
				t.Fatalf("another client took the lock %v after it was acquired (TTL %v) while its holder had not been told it was lost", took, l.TTL())
			}
			mustRelease(t, ctx, l2)
			return
		}
		if !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire: %v", err)
		}
		if time.Now().After(giveUp) {
			t.Fatalf("the lock was not freed within %v of its TTL", s.slack())
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *suite) oldHolder(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2, c3 := s.client(t), s.client(t), s.client(t)
	name := s.name(t, "x")
	old := mustAcquire(t, ctx, c1, name, locker.AutoRefresh(false))
	s.expire(t, ctx, c1, name)
	nu := acquireWithin(t, ctx, c2, name, s.ttl()+s.slack())
	if err := old.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("old holder's Refresh = %v, want ErrNotHeld", err)
	}
	if err := old.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("old holder's Release = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, c3, name, "the new holder must keep it after the old holder's refresh and release")
	if err := nu.Refresh(ctx); err != nil {
		t.Fatalf("new holder's Refresh: %v", err)
	}
	mustRelease(t, ctx, nu)
}

func (s *suite) forgedToken(t *testing.T) {
	ctx := s.ctx(t)
	c1, drv := s.clientDriver(t)
	c2 := s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	forged := backend.Claim{Key: s.key(name), Token: strings.Repeat("0", 32), TTL: s.ttl(), Fence: l.Fence()}
	if err := drv.Release(ctx, forged); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release with a forged token = %v, want ErrNotHeld", err)
	}
	if err := drv.Refresh(ctx, forged); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh with a forged token = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, c2, name, "a forged release must not free it")
	notLost(t, l)
	mustRelease(t, ctx, l)
}

func (s *suite) doubleRelease(t *testing.T) {
	ctx := s.ctx(t)
	c1, drv := s.clientDriver(t)
	c2 := s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	mustRelease(t, ctx, l)
	if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	// The driver itself must tell, too: a retried release must not free
	// the next holder's lock.
	stale := backend.Claim{Key: s.key(name), Token: string(l.Token()), TTL: s.ttl(), Fence: l.Fence()}
	if err := drv.Release(ctx, stale); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("driver Release of a released lock = %v, want ErrNotHeld", err)
	}
	l2 := mustAcquire(t, ctx, c2, name)
	if err := drv.Release(ctx, stale); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("driver Release with the previous holder's token = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, c1, name, "the previous holder's release must not free the new holder's lock")
	mustRelease(t, ctx, l2)
}

func (s *suite) refreshExtends(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	attempts(t, func(attempt int) string {
		name := s.name(t, fmt.Sprint("x", attempt))
		l := mustAcquire(t, ctx, c1, name, locker.AutoRefresh(false))
		defer l.Release(ctx)
		for range 3 {
			time.Sleep(l.TTL() * 6 / 10)
			until := l.Deadline()
			if late := okUntil(t, "Refresh", l.Refresh(ctx), until); late != "" {
				return late
			}
		}
		// 1.8 TTLs after the acquisition, it is still held.
		until := l.Deadline()
		if late := refuseUntil(t, ctx, c2, name, until, "explicit refreshes extend it"); late != "" {
			return late
		}
		if late := notLostUntil(t, l, until); late != "" {
			return late
		}
		return okUntil(t, "Release", l.Release(ctx), until)
	})
}

func (s *suite) watchdog(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	hold := 10 * l.TTL()
	wctx, cancel := context.WithTimeout(ctx, hold)
	defer cancel()
	w, err := c2.Acquire(wctx, name)
	if err == nil {
		w.Release(ctx)
		t.Fatalf("a waiter got the lock while the watchdog kept it refreshed")
	}
	if !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("waiter: %v, want ErrNotAcquired after its deadline", err)
	}
	notLost(t, l)
	mustRelease(t, ctx, l)
	mustRelease(t, ctx, mustAcquire(t, ctx, c2, name))
}

func (s *suite) lostSignal(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l := mustAcquire(t, ctx, c1, name)
	if err := s.h.Expire(ctx, s.key(name)); err != nil {
		t.Fatalf("Harness.Expire: %v", err)
	}
	taken := acquireWithin(t, ctx, c2, name, l.TTL()+s.slack())
	waitLost(t, l, l.TTL()+s.slack(), "the lock was taken away")
	if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release of a lost lock = %v, want ErrNotHeld", err)
	}
	mustRefuse(t, ctx, c1, name, "the new holder keeps it")
	mustRelease(t, ctx, taken)
}

func (s *suite) doCancels(t *testing.T) {
	ctx := s.ctx(t)
	c1 := s.client(t)
	name := s.name(t, "x")
	ttl := s.ttl()
	err := c1.Do(ctx, name, func(fctx context.Context) error {
		if err := s.h.Expire(ctx, s.key(name)); err != nil {
			return fmt.Errorf("Harness.Expire: %w", err)
		}
		select {
		case <-fctx.Done():
			if !errors.Is(context.Cause(fctx), locker.ErrLost) {
				return fmt.Errorf("context cause %v, want ErrLost", context.Cause(fctx))
			}
			return nil
		case <-time.After(ttl + s.slack()):
			return errors.New("the context was not cancelled after the lock was taken away")
		}
	})
	if !errors.Is(err, locker.ErrLost) || strings.Contains(err.Error(), "not cancelled") || strings.Contains(err.Error(), "cause") {
		t.Fatalf("Do = %v, want only ErrLost", err)
	}
	// Do released what it held: the name is free.
	mustRelease(t, ctx, acquireWithin(t, ctx, c1, name, ttl+s.slack()))
}

func (s *suite) reentrant(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	var ls []*locker.Lock
	for i := range 3 {
		l, err := c1.Acquire(ctx, name, locker.Reentrant("job-1"))
		if err != nil {
			t.Fatalf("Acquire level %d: %v", i+1, err)
		}
		ls = append(ls, l)
		if l.Fence() != ls[0].Fence() {
			t.Fatalf("level %d fence %d, outer %d: re-entry must keep the fence", i+1, l.Fence(), ls[0].Fence())
		}
	}
	mustRefuse(t, ctx, c1, name, "another reentrant key of the same client must wait", locker.Reentrant("job-2"))
	mustRefuse(t, ctx, c2, name, "it is held three deep")
	mustRelease(t, ctx, ls[2])
	mustRelease(t, ctx, ls[1])
	mustRefuse(t, ctx, c2, name, "the outermost level is still held")
	mustRelease(t, ctx, ls[0])
	mustRelease(t, ctx, mustAcquire(t, ctx, c2, name))
}

func (s *suite) reentryExtends(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	attempts(t, func(attempt int) string {
		name := s.name(t, fmt.Sprint("x", attempt))
		outer := mustAcquire(t, ctx, c1, name, locker.Reentrant("job"), locker.AutoRefresh(false))
		defer outer.Release(ctx)
		time.Sleep(outer.TTL() * 6 / 10)
		until := outer.Deadline()
		inner, err := c1.TryAcquire(ctx, name, locker.Reentrant("job"))
		if late := okUntil(t, "re-entry", err, until); late != "" {
			return late
		}
		defer inner.Release(ctx)
		time.Sleep(outer.TTL() * 6 / 10)
		until = outer.Deadline()
		if late := refuseUntil(t, ctx, c2, name, until, "re-entry extends the TTL"); late != "" {
			return late
		}
		if late := notLostUntil(t, outer, until); late != "" {
			return late
		}
		if late := okUntil(t, "Release of the inner level", inner.Release(ctx), until); late != "" {
			return late
		}
		return okUntil(t, "Release", outer.Release(ctx), until)
	})
}

func (s *suite) reentryAfterLoss(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	outer := mustAcquire(t, ctx, c1, name, locker.Reentrant("job"))
	if err := s.h.Expire(ctx, s.key(name)); err != nil {
		t.Fatalf("Harness.Expire: %v", err)
	}
	waitLost(t, outer, outer.TTL()+s.slack(), "the lock was taken away")
	taken := acquireWithin(t, ctx, c2, name, s.slack())
	_, err := c1.Acquire(ctx, name, locker.Reentrant("job"))
	if !errors.Is(err, locker.ErrLost) {
		t.Fatalf("re-entry after the loss = %v, want ErrLost", err)
	}
	mustRelease(t, ctx, taken)
}

func (s *suite) fencesIncrease(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	name := s.name(t, "x")
	var last uint64
	for i := range 6 {
		l := mustAcquire(t, ctx, cs[i%2], name)
		if l.Fence() == 0 {
			mustRelease(t, ctx, l)
			t.Skip("the driver issues no fencing tokens (Grant.Fence 0)")
		}
		if l.Fence() <= last {
			t.Fatalf("holder %d got fence %d after %d: fences must strictly increase", i, l.Fence(), last)
		}
		last = l.Fence()
		mustRelease(t, ctx, l)
	}
}

func (s *suite) fencesAcrossExpiry(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	name := s.name(t, "x")
	l1 := mustAcquire(t, ctx, c1, name, locker.AutoRefresh(false))
	if l1.Fence() == 0 {
		t.Skip("the driver issues no fencing tokens (Grant.Fence 0)")
	}
	s.expire(t, ctx, c1, name)
	l2 := acquireWithin(t, ctx, c2, name, s.ttl()+s.slack())
	if l2.Fence() <= l1.Fence() {
		t.Fatalf("fence %d after an expiry takeover of fence %d: must increase", l2.Fence(), l1.Fence())
	}
	mustRelease(t, ctx, l2)
}

func (s *suite) counter(t *testing.T) {
	ctx := s.ctx(t)
	cs := []*locker.Client{s.client(t), s.client(t)}
	names := []string{s.name(t, "a"), s.name(t, "b")}
	const workers, rounds = 8, 6
	// Atomic loads and stores, so -race does not object; the read-sleep-
	// write is a lost update unless the lock excludes.
	var counts, inside [2]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				i := (w + r) % 2
				err := cs[w%2].Do(ctx, names[i], func(context.Context) error {
					if n := inside[i].Add(1); n != 1 {
						t.Errorf("%d holders inside %q at once", n, names[i])
					}
					v := counts[i].Load()
					time.Sleep(time.Millisecond)
					counts[i].Store(v + 1)
					inside[i].Add(-1)
					return nil
				})
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := counts[0].Load()+counts[1].Load(), int64(workers*rounds); got != want {
		t.Fatalf("counters add up to %d, want %d: updates were lost", got, want)
	}
	if counts[0].Load() != workers*rounds/2 {
		t.Fatalf("counter a = %d, want %d", counts[0].Load(), workers*rounds/2)
	}
}

// countingDriver counts the calls that reach the driver.
type countingDriver struct {
	backend.Driver
	calls atomic.Int32
}

func (d *countingDriver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	d.calls.Add(1)
	return d.Driver.TryAcquire(ctx, l)
}

func (s *suite) badInput(t *testing.T) {
	ctx := s.ctx(t)
	drv, err := s.h.NewDriver(ctx)
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	cd := &countingDriver{Driver: drv}
	c, err := locker.New(cd, locker.WithNamespace(s.ns))
	if err != nil {
		t.Fatalf("locker.New: %v", err)
	}
	defer c.Close()
	names := map[string]string{
		"empty":        "",
		"NUL":          "a\x00b",
		"invalid UTF8": "a\xffb",
		"too long":     strings.Repeat("x", locker.MaxNameLen+1),
	}
	ops := map[string]func(string, ...locker.LockOption) error{
		"Acquire": func(n string, o ...locker.LockOption) error {
			_, err := c.Acquire(ctx, n, o...)
			return err
		},
		"TryAcquire": func(n string, o ...locker.LockOption) error {
			_, err := c.TryAcquire(ctx, n, o...)
			return err
		},
		"Do": func(n string, o ...locker.LockOption) error {
			return c.Do(ctx, n, func(context.Context) error { return nil }, o...)
		},
	}
	call := func(op string, f func() error) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return f()
	}
	for opName, op := range ops {
		for what, n := range names {
			if err := call(opName, func() error { return op(n) }); !errors.Is(err, locker.ErrInvalidName) {
				t.Errorf("%s with a name that is %s = %v, want ErrInvalidName", opName, what, err)
			}
		}
		for _, ttl := range []time.Duration{0, -time.Second, locker.MaxTTL + 1} {
			if err := call(opName, func() error { return op(s.name(t, "x"), locker.TTL(ttl)) }); !errors.Is(err, locker.ErrInvalidTTL) {
				t.Errorf("%s with TTL %v = %v, want ErrInvalidTTL", opName, ttl, err)
			}
		}
	}
	if n := cd.calls.Load(); n != 0 {
		t.Errorf("bad input reached the driver %d times, want 0", n)
	}

	// Valid extremes: a TTL below the store's granularity is rounded up
	// (never 0, never "no expiry"), and the longest TTL does not overflow.
	c2 := s.client(t)
	for _, ttl := range []time.Duration{time.Nanosecond, locker.MaxTTL} {
		name := s.name(t, ttl.String())
		l, err := c.TryAcquire(ctx, name, locker.TTL(ttl), locker.AutoRefresh(false))
		if errors.Is(err, locker.ErrInvalidTTL) {
			continue // the backend cannot express it, and says so
		}
		if err != nil {
			t.Errorf("TryAcquire with TTL %v = %v, want success or ErrInvalidTTL", ttl, err)
			continue
		}
		if l.TTL() < ttl {
			t.Errorf("TTL %v granted as %v: shortened", ttl, l.TTL())
		}
		if _, session := backend.As[backend.Session](drv); ttl == locker.MaxTTL || session {
			time.Sleep(50 * time.Millisecond)
			mustRefuse(t, ctx, c2, name, fmt.Sprintf("a lock with TTL %v is held", ttl))
			mustRelease(t, ctx, l)
			continue
		}
		// Rounded up, it still expires.
		acquireWithin(t, ctx, c2, name, l.TTL()+s.slack())
	}
	if _, err := locker.New(drv, locker.WithNamespace("a/b")); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("New with namespace %q = %v, want ErrInvalidName", "a/b", err)
	}
}

func (s *suite) validNames(t *testing.T) {
	ctx := s.ctx(t)
	c1, c2 := s.client(t), s.client(t)
	prefix := t.Name()
	names := []string{
		"/", ".", "..", "a/../b", " ", "tab\tnewline\n", "\x01ctl\x7f", "ü日本", "%2F", "{tag}", "a:b*c?[d]",
		strings.Repeat("ü", locker.MaxNameLen/2), // the longest name: 256 bytes
		strings.Repeat("/", locker.MaxNameLen),
	}
	var held []*locker.Lock
	for _, n := range names {
		if n != names[11] && n != names[12] {
			n = prefix + n
		}
		l, err := c1.TryAcquire(ctx, n)
		if err != nil {
			t.Errorf("TryAcquire(%q): %v", n, err)
			continue
		}
		held = append(held, l)
		mustRefuse(t, ctx, c2, n, "names with any valid bytes must work and exclude")
	}
	for _, l := range held {
		mustRelease(t, ctx, l)
	}
}

func (s *suite) fifo(t *testing.T) {
	if !s.tr.FIFO.Has(backend.Exclusive) {
		t.Skip("the harness does not claim FIFO order for locks (Traits.FIFO)")
	}
	ctx := s.ctx(t)
	cs, arrived := s.fifoClients(t)
	name := s.name(t, "x")
	s.servedInOrder(t, ctx, cs, arrived, name, mustAcquire(t, ctx, cs[0], name))
}

// arrivals receives the number of each waiter of servedInOrder as it calls
// its Client: an Observer's AcquireStart, the number in its context.
type arrivals chan int

type waiterKey struct{}

// fifoClients returns two clients whose waiters servedInOrder sees arrive.
func (s *suite) fifoClients(t *testing.T) ([]*locker.Client, arrivals) {
	arrived := make(arrivals, 16)
	obs := &locker.Observer{AcquireStart: func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
		if i, ok := ctx.Value(waiterKey{}).(int); ok && e.Wait {
			select {
			case arrived <- i:
			default:
			}
		}
		return nil
	}}
	var cs []*locker.Client
	for range 2 {
		c, _ := s.clientDriver(t, locker.WithObserver(obs))
		cs = append(cs, c)
	}
	return cs, arrived
}

// servedInOrder queues 4 waiters for name, alternating between cs (from
// fifoClients), each arriving once the one before is queued, releases l,
// and checks that they got it in arrival order.
func (s *suite) servedInOrder(t *testing.T, ctx context.Context, cs []*locker.Client, arrived arrivals, name string, l *locker.Lock, opts ...locker.LockOption) {
	t.Helper()
	const waiters = 4
	base, counts := s.entries(t, ctx, name)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			w, err := cs[i%2].Acquire(context.WithValue(ctx, waiterKey{}, i), name, opts...)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			w.Release(ctx)
		})
		s.queued(t, ctx, arrived, i, name, base+i+1, counts)
	}
	mustRelease(t, ctx, l)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("waiters served in order %v, want arrival order 0..%d", order, waiters-1)
		}
	}
}

// entries returns the store's entries for name, and whether they count
// waiters: a harness that claims FIFO and counts entries (WaiterCounter)
// keeps one per waiter in its queue.
func (s *suite) entries(t *testing.T, ctx context.Context, name string) (int, bool) {
	t.Helper()
	wc, ok := s.h.(WaiterCounter)
	if !ok || !s.tr.FIFO.Has(backend.Exclusive) {
		return 0, false
	}
	n, err := wc.Entries(ctx, s.key(name))
	if err != nil {
		t.Fatalf("Entries: %v", err)
	}
	return n, true
}

// queued waits until waiter i is queued: until the store has want entries
// for name where they count waiters (entries), and at least 200 ms. Both
// count from when the waiter called its Client, not from when its
// goroutine was started, which a loaded machine runs late.
func (s *suite) queued(t *testing.T, ctx context.Context, arrived arrivals, i int, name string, want int, counts bool) {
	t.Helper()
	select {
	case got := <-arrived:
		if got != i {
			t.Fatalf("waiter %d called its Client, want waiter %d", got, i)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("waiter %d did not call its Client within 10s", i)
	}
	called := time.Now()
	if counts {
		wc := s.h.(WaiterCounter)
		for deadline := called.Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n, err := wc.Entries(ctx, s.key(name))
			if err != nil {
				t.Fatalf("Entries: %v", err)
			}
			if n >= want {
				break
			}
			if time.Now().After(deadline) {
				t.Logf("waiter %d: %d entries for the key 10s after it called its Client, want %d", i, n, want)
				break
			}
		}
	}
	// An entry in the store is not yet a look at who is ahead of it (a
	// ZooKeeper waiter lists the queue after creating its node): a release
	// before that look is no wait at all. Give it the time it always had.
	time.Sleep(time.Until(called.Add(200 * time.Millisecond)))
}

func (s *suite) close(t *testing.T) {
	ctx := s.ctx(t)
	other := s.client(t)
	held, waited := s.name(t, "held"), s.name(t, "waited")
	blocker := mustAcquire(t, ctx, other, waited)

	check := leakCheck(t, s.tr.IgnoreGoroutines)
	drv, err := s.h.NewDriver(ctx)
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	c, err := locker.New(drv, locker.WithNamespace(s.ns), locker.WithDefaultTTL(s.ttl()))
	if err != nil {
		t.Fatalf("locker.New: %v", err)
	}
	l := mustAcquire(t, ctx, c, held)
	waitErr := make(chan error, 1)
	go func() { _, err := c.Acquire(ctx, waited); waitErr <- err }()
	time.Sleep(100 * time.Millisecond)

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, locker.ErrClosed) {
			t.Errorf("Acquire waiting during Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Acquire still waiting 5s after Close")
	}
	select {
	case <-l.Lost():
		if !errors.Is(l.Err(), locker.ErrClosed) {
			t.Errorf("held lock's Err after Close = %v, want ErrClosed", l.Err())
		}
	default:
		t.Errorf("held lock's Lost did not fire on Close")
	}
	if _, err := c.TryAcquire(ctx, held); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if _, err := c.Acquire(ctx, held); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
	if err := l.Refresh(ctx); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Refresh after Close = %v, want ErrClosed", err)
	}
	if err := l.Release(ctx); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	check()
	// Close released the lock in the store.
	mustRelease(t, ctx, acquireWithin(t, ctx, other, held, s.slack()))
	mustRelease(t, ctx, blocker)
}
