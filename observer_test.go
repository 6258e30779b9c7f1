package locker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// recorder keeps every event, as one line each, and the events themselves.
type recorder struct {
	mu     sync.Mutex
	lines  []string
	done   []locker.AcquireDoneEvent
	lost   []locker.LostEvent
	rel    []locker.ReleaseEvent
	refr   []locker.RefreshEvent
	stores []locker.StoreErrorEvent
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *recorder) observer() *locker.Observer {
	return &locker.Observer{
		AcquireStart: func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
			r.add("start %s wait=%v", e.Name, e.Wait)
			return nil
		},
		AcquireDone: func(_ context.Context, e locker.AcquireDoneEvent) {
			r.add("done %s wait=%v err=%v", e.Name, e.Wait, e.Err != nil)
			r.mu.Lock()
			r.done = append(r.done, e)
			r.mu.Unlock()
		},
		Refreshed: func(e locker.RefreshEvent) {
			r.add("refresh %s auto=%v err=%v", e.Name, e.Auto, e.Err != nil)
			r.mu.Lock()
			r.refr = append(r.refr, e)
			r.mu.Unlock()
		},
		Lost: func(e locker.LostEvent) {
			r.add("lost %s", e.Name)
			r.mu.Lock()
			r.lost = append(r.lost, e)
			r.mu.Unlock()
		},
		Released: func(e locker.ReleaseEvent) {
			r.add("released %s err=%v", e.Name, e.Err != nil)
			r.mu.Lock()
			r.rel = append(r.rel, e)
			r.mu.Unlock()
		},
		StoreError: func(e locker.StoreErrorEvent) {
			r.mu.Lock()
			r.stores = append(r.stores, e)
			r.mu.Unlock()
		},
	}
}

func (r *recorder) take() ([]string, []locker.AcquireDoneEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lines, done := r.lines, r.done
	r.lines, r.done = nil, nil
	return lines, done
}

// started reports whether AcquireStart was seen for name (without taking
// the lines).
func (r *recorder) started(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if strings.HasPrefix(l, "start "+name+" ") {
			return true
		}
	}
	return false
}

func wantLines(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestObserverScript(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	var r1, r2 recorder
	c1 := newClient(t, store, locker.WithObserver(r1.observer()), locker.WithNamespace("ops"))
	c2 := newClient(t, store, locker.WithObserver(r2.observer()), locker.WithNamespace("ops"))

	l, err := c1.TryAcquire(ctx, "job", locker.Label("host-a"))
	if err != nil {
		t.Fatal(err)
	}
	lines, done := r1.take()
	wantLines(t, lines, "start job wait=false", "done job wait=false err=false")
	if e := done[0]; e.Namespace != "ops" || e.Owner != "host-a" || e.Fence != l.Fence() || e.Attempts != 1 || e.Contended || e.Woken != locker.WakeFirst {
		t.Fatalf("granted TryAcquire: %+v", e)
	}

	if _, err := c2.TryAcquire(ctx, "job"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock = %v", err)
	}
	lines, done = r2.take()
	wantLines(t, lines, "start job wait=false", "done job wait=false err=true")
	if e := done[0]; !e.Contended || !errors.Is(e.Err, locker.ErrNotAcquired) || e.Fence != 0 {
		t.Fatalf("refused TryAcquire: %+v", e)
	}

	// A waiter woken by the release notification.
	got := make(chan *locker.Lock)
	go func() {
		w, err := c2.Acquire(ctx, "job", locker.AutoRefresh(false))
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	// Waited runs from AcquireStart, which a loaded machine may run late:
	// the wait is bounded below from the moment the start was seen.
	deadline := time.Now().Add(10 * time.Second)
	for !r2.started("job") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !r2.started("job") {
		t.Fatal("the waiter's AcquireStart was not seen in 10s")
	}
	seen := time.Now()
	time.Sleep(100 * time.Millisecond)
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	releasing := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	lines, _ = r1.take()
	wantLines(t, lines, "refresh job auto=false err=false", "released job err=false")
	if e := r1.rel[0]; e.Held < 150*time.Millisecond || e.Fence != l.Fence() || e.Err != nil {
		t.Fatalf("release: %+v, want held >= 150ms", e)
	}
	lines, done = r2.take()
	wantLines(t, lines, "start job wait=true", "done job wait=true err=false")
	if e := done[0]; !e.Contended || e.Attempts < 2 || e.Woken != locker.WakeNotified || e.Waited < releasing.Sub(seen) || e.Fence != w.Fence() {
		t.Fatalf("waited Acquire: %+v, want waited >= %v", e, releasing.Sub(seen))
	}

	// A loss found by a refresh.
	if !store.Expire(backend.Key("ops", w.Name())) {
		t.Fatal("the waiter's lock is not in the store")
	}
	w.Refresh(ctx)
	lines, _ = r2.take()
	wantLines(t, lines, "refresh job auto=false err=true", "lost job")
	if e := r2.lost[0]; !errors.Is(e.Err, locker.ErrLost) || e.Fence != w.Fence() || e.Cause != locker.LostGone {
		t.Fatalf("lost: %+v", e)
	}
	if len(r2.stores) != 0 {
		t.Fatalf("answers reported as store errors: %+v", r2.stores)
	}
}

// The watchdog's refreshes and store failures are reported, with whether
// the Client retries them.
func TestObserverWatchdogAndStoreErrors(t *testing.T) {
	ctx := context.Background()
	var r recorder
	f := &flaky{Driver: memDriver(memlock.NewStore())}
	c := newClientOn(t, f, locker.WithObserver(r.observer()))
	// Down before the acquisition (flaky fails refreshes only): the
	// watchdog's first refresh fails however late this goroutine runs on.
	f.down.Store(true)
	l, err := c.TryAcquire(ctx, "x", locker.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the lock was not lost with every refresh failing")
	}
	// The hook runs just after Lost closes, on the watchdog's goroutine.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		n := len(r.lost)
		r.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.refr) == 0 || !r.refr[0].Auto || r.refr[0].Err == nil {
		t.Fatalf("watchdog refreshes: %+v", r.refr)
	}
	if len(r.stores) == 0 || r.stores[0].Op != "refresh" || !r.stores[0].Retrying {
		t.Fatalf("store errors: %+v", r.stores)
	}
	if len(r.lost) != 1 || !errors.Is(r.lost[0].Err, locker.ErrLost) || r.lost[0].Cause != locker.LostExpired {
		t.Fatalf("lost: %+v", r.lost)
	}

	// A waiting Acquire through a blip reports each failed try. The store
	// comes back once a failed try was reported, not at a set time: a
	// loaded machine may run the Acquire late, past such a time.
	var r2 recorder
	b := &blinking{Driver: memDriver(memlock.NewStore())}
	c2 := newClientOn(t, b, locker.WithObserver(r2.observer()))
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			r2.mu.Lock()
			n := len(r2.stores)
			r2.mu.Unlock()
			if n > 0 {
				break
			}
		}
		b.up.Store(true)
	}()
	if _, err := c2.Acquire(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	r2.mu.Lock()
	defer r2.mu.Unlock()
	if len(r2.stores) == 0 || r2.stores[0].Op != "acquire" || !r2.stores[0].Retrying {
		t.Fatalf("store errors of a waiting Acquire: %+v", r2.stores)
	}
	if e := r2.done[0]; e.Err != nil || e.Attempts != int(b.tries.Load()) || e.Woken != locker.WakeTimer {
		t.Fatalf("Acquire through a blip: %+v (driver saw %d tries)", e, b.tries.Load())
	}
}

// BenchmarkObserverCost is the uncontended TryAcquire+Release on mem
// without an Observer, with an empty one and with every hook set: the
// first two must be within 2% of each other (compare ns/op).
func BenchmarkObserverCost(b *testing.B) {
	var n int
	full := &locker.Observer{
		AcquireStart: func(ctx context.Context, _ locker.AcquireStartEvent) context.Context { n++; return ctx },
		AcquireDone:  func(context.Context, locker.AcquireDoneEvent) { n++ },
		Released:     func(locker.ReleaseEvent) { n++ },
	}
	for _, bc := range []struct {
		name string
		obs  *locker.Observer
	}{{"none", nil}, {"empty", &locker.Observer{}}, {"full", full}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			opts := []locker.Option{}
			if bc.obs != nil {
				opts = append(opts, locker.WithObserver(bc.obs))
			}
			c := newClient(b, memlock.NewStore(), opts...)
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.TryAcquire(ctx, "x")
				if err != nil {
					b.Fatal(err)
				}
				l.Release(ctx)
			}
		})
	}
}

// Each thing is said once: one prefix, the loss once.
func TestErrorsSayEachThingOnce(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	c := newClient(t, store)
	l, err := c.TryAcquire(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "report")
	if got, want := err.Error(), fmt.Sprintf(`locker: try-acquire "report": not acquired (held by %q, fence %d)`, l.Label(), l.Fence()); got != want {
		t.Fatalf("refusal = %q, want %q", got, want)
	}
	l.Release(ctx)

	err = c.Do(ctx, "report", func(ctx context.Context) error {
		store.Expire(backend.Key("locker", "report"))
		locker.FromContext(ctx).Refresh(ctx) // finds it gone: ctx ends with the loss
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, locker.ErrLost) || strings.Count(err.Error(), "lock lost") != 1 {
		t.Fatalf("Do = %q, want the loss said once", err)
	}
}

type ctxMark struct{}

// Do's events wrap its acquisition's, and fn runs in the context DoStart
// returned, as a tracer's spans need.
func TestObserverDoNestsContexts(t *testing.T) {
	var order []string
	var seenInFn, seenInAcquire any
	o := &locker.Observer{
		DoStart: func(ctx context.Context, e locker.DoStartEvent) context.Context {
			order = append(order, "do-start")
			return context.WithValue(ctx, ctxMark{}, "do:"+e.Name)
		},
		AcquireStart: func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
			order = append(order, "acquire-start")
			seenInAcquire = ctx.Value(ctxMark{})
			return ctx
		},
		AcquireDone: func(context.Context, locker.AcquireDoneEvent) { order = append(order, "acquire-done") },
		Released:    func(locker.ReleaseEvent) { order = append(order, "released") },
		DoDone: func(ctx context.Context, e locker.DoDoneEvent) {
			order = append(order, "do-done")
			if e.Fence == 0 || e.Held <= 0 || e.Err == nil || ctx.Value(ctxMark{}) == nil {
				t.Errorf("DoDone: %+v", e)
			}
		},
	}
	c := newClient(t, memlock.NewStore(), locker.WithObserver(o))
	boom := errors.New("boom")
	err := c.Do(context.Background(), "job", func(ctx context.Context) error {
		seenInFn = ctx.Value(ctxMark{})
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v", err)
	}
	if seenInFn != "do:job" || seenInAcquire != "do:job" {
		t.Fatalf("contexts: fn saw %v, acquisition saw %v; want DoStart's", seenInFn, seenInAcquire)
	}
	wantLines(t, order, "do-start", "acquire-start", "acquire-done", "released", "do-done")
}

// Every event names the lock's mode, and a permit its semaphore's limit:
// from the start of the acquisition (before any grant) to the release.
func TestObserverEventsCarryMode(t *testing.T) {
	ctx := context.Background()
	var (
		mu   sync.Mutex
		seen []string
	)
	add := func(what string, ref locker.LockRef) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %s %s/%d", what, ref.Name, ref.Mode, ref.Limit))
	}
	obs := &locker.Observer{
		AcquireStart: func(_ context.Context, e locker.AcquireStartEvent) context.Context {
			add("start", e.LockRef)
			return nil
		},
		AcquireDone: func(_ context.Context, e locker.AcquireDoneEvent) { add("done", e.LockRef) },
		DoStart: func(_ context.Context, e locker.DoStartEvent) context.Context {
			add("do", e.LockRef)
			return nil
		},
		Released: func(e locker.ReleaseEvent) { add("released", e.LockRef) },
	}
	c := newClient(t, memlock.NewStore(), locker.WithObserver(obs))
	for _, tc := range []struct {
		name string
		opt  locker.LockOption
	}{{"sem", locker.Semaphore(3)}, {"rw", locker.Read()}, {"rw", locker.Write()}, {"plain", locker.TTL(time.Minute)}} {
		l, err := c.Acquire(ctx, tc.name, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Do(ctx, "sem", func(context.Context) error { return nil }, locker.Semaphore(2)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	wantLines(t, seen,
		"start sem permit/3", "done sem permit/3", "released sem permit/3",
		"start rw read/0", "done rw read/0", "released rw read/0",
		"start rw write/0", "done rw write/0", "released rw write/0",
		"start plain exclusive/0", "done plain exclusive/0", "released plain exclusive/0",
		"do sem permit/2", "start sem permit/2", "done sem permit/2", "released sem permit/2")
}
