package locker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// free reports the names of names that c can take at once (and gives
// back).
func free(t *testing.T, c *locker.Client, names ...string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		l, err := c.TryAcquire(context.Background(), n)
		if err != nil {
			continue
		}
		out = append(out, n)
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestLockSetAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s := memlock.NewStore()
	a, b, obs := newClient(t, s), newClient(t, s), newClient(t, s)
	held, err := b.TryAcquire(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.TryAcquireAll(ctx, []string{"z", "m", "a"})
	if !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), `"m"`) {
		t.Fatalf("TryAcquireAll with m held: %v, want ErrNotAcquired naming m", err)
	}
	if got := free(t, obs, "a", "z"); len(got) != 2 {
		t.Fatalf("after the refusal, free: %v; want a and z (nothing kept)", got)
	}
	// Waiting, cut by the context: the same.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := a.AcquireAll(cctx, []string{"z", "m", "a"}); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("AcquireAll cut by its context: %v", err)
	}
	if got := free(t, obs, "a", "z"); len(got) != 2 {
		t.Fatalf("after the cut wait, free: %v; want a and z", got)
	}
	// WaitAtMost bounds the whole set's wait.
	start := time.Now()
	if _, err := a.AcquireAll(ctx, []string{"a", "m"}, locker.WaitAtMost(100*time.Millisecond)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("AcquireAll with WaitAtMost: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("WaitAtMost(100ms) waited %v", d)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	set, err := a.TryAcquireAll(ctx, []string{"z", "m", "a", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Names(); !slices.Equal(got, []string{"a", "m", "z"}) {
		t.Errorf("Names: %v, want [a m z]", got)
	}
	if set.Fence("m") == 0 || set.Fence("q") != 0 {
		t.Errorf("Fence(m) %d, Fence(q) %d", set.Fence("m"), set.Fence("q"))
	}
	if got := free(t, obs, "a", "m", "z"); len(got) != 0 {
		t.Fatalf("while the set is held, free: %v", got)
	}
	if err := set.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); !errors.Is(err, locker.ErrNotHeld) || strings.Count(err.Error(), "released already") != 1 {
		t.Errorf("second Release: %v, want one ErrNotHeld", err)
	}
	if got := free(t, obs, "a", "m", "z"); len(got) != 3 {
		t.Fatalf("after Release, free: %v", got)
	}
}

func TestLockSetBadInput(t *testing.T) {
	c := newClient(t, memlock.NewStore())
	ctx := context.Background()
	for _, names := range [][]string{nil, {}, {"ok", ""}, {"ok", strings.Repeat("x", locker.MaxNameLen+1)}} {
		if _, err := c.TryAcquireAll(ctx, names); !errors.Is(err, locker.ErrInvalidName) {
			t.Errorf("TryAcquireAll(%q): %v, want ErrInvalidName", names, err)
		}
	}
	if got := free(t, c, "ok"); len(got) != 1 {
		t.Error("a refused set took a lock")
	}
}

// Callers asking for the same names in crossed orders always finish.
func TestLockSetCrossedOrders(t *testing.T) {
	s := memlock.NewStore()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, names := range [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "a"}, {"c", "a"}} {
		c := newClient(t, s)
		wg.Go(func() {
			for j := range 200 {
				err := c.DoAll(ctx, names, func(ctx context.Context, set *locker.LockSet) error { return nil })
				if err != nil {
					errs <- fmt.Errorf("caller %d, round %d: %w", i, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// The loss of one lock is the loss of the set: Lost fires, Err names it,
// and DoAll's context ends with it as the cause.
func TestLockSetLoss(t *testing.T) {
	ctx := context.Background()
	s := memlock.NewStore()
	c, other := newClient(t, s), newClient(t, s)
	err := c.DoAll(ctx, []string{"p", "q"}, func(ctx context.Context, set *locker.LockSet) error {
		st, err := other.Inspect(ctx, "q")
		if err != nil {
			return err
		}
		if _, err := other.ForceRelease(ctx, "q", st.Fence); err != nil {
			return err
		}
		if err := set.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) {
			return fmt.Errorf("refresh after q was broken: %v", err)
		}
		select {
		case <-set.Lost():
		case <-time.After(5 * time.Second):
			return errors.New("Lost did not fire")
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, locker.ErrLost) || !strings.Contains(err.Error(), `"q"`) {
		t.Fatalf("DoAll: %v, want ErrLost naming q", err)
	}
	if got := free(t, other, "p", "q"); len(got) != 2 {
		t.Fatalf("after DoAll, free: %v", got)
	}
}

// Lost, asked before any loss, fires at the first one, once, and a set
// released first is never lost.
func TestLockSetLostAskedFirst(t *testing.T) {
	ctx := context.Background()
	s := memlock.NewStore()
	c, other := newClient(t, s), newClient(t, s)
	set, err := c.TryAcquireAll(ctx, []string{"p", "q", "r"})
	if err != nil {
		t.Fatal(err)
	}
	lost := set.Lost()
	if set.Lost() != lost {
		t.Fatal("Lost returned another channel the second time")
	}
	select {
	case <-lost:
		t.Fatal("Lost fired while every lock is held")
	default:
	}
	for _, n := range []string{"q", "r"} {
		st, err := other.Inspect(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.ForceRelease(ctx, n, st.Fence); err != nil {
			t.Fatal(err)
		}
	}
	if err := set.Refresh(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh after q and r were broken = %v", err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire")
	}
	if err := set.Release(ctx); err == nil {
		t.Fatal("Release of a lost set = nil")
	}

	held, err := c.TryAcquireAll(ctx, []string{"p", "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Lost():
		t.Fatal("Lost fired for a set released whole")
	case <-time.After(50 * time.Millisecond):
	}
}

// A waiter for {a, b} is not starved by a stream of single holders of a:
// where the store queues (memlock's FairDriver, FIFO), it takes its place
// in a's queue like any waiter, so it gets the set while the stream goes
// on.
func TestLockSetNotStarved(t *testing.T) {
	s := memlock.NewStore()
	newClient := func(t *testing.T, s *memlock.Store) *locker.Client {
		d, err := memlock.NewFair(s)
		if err != nil {
			t.Fatal(err)
		}
		return newClientOn(t, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		c := newClient(t, s)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := c.Do(ctx, "a", func(context.Context) error { time.Sleep(time.Millisecond); return nil }); err != nil {
					return
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // the stream is on
	start := time.Now()
	err := newClient(t, s).DoAll(ctx, []string{"b", "a"}, func(context.Context, *locker.LockSet) error { return nil })
	took := time.Since(start)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("DoAll beside a stream of holders of a: %v (after %v)", err, took)
	}
	// Three holders ahead at most, a millisecond each: far below this.
	if took > 5*time.Second {
		t.Fatalf("DoAll took %v beside a stream of single holders of a", took)
	}
}

// setCounter counts a memlock driver's requests.
type setCounter struct {
	*memlock.Driver
	one, all, releaseAll atomic.Int32
	unsupported          bool // TryAcquireAll refuses every set
}

func (d *setCounter) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	d.one.Add(1)
	return d.Driver.TryAcquire(ctx, c)
}

func (d *setCounter) TryAcquireAll(ctx context.Context, cs []backend.Claim) ([]backend.Grant, error) {
	d.all.Add(1)
	if d.unsupported {
		return nil, fmt.Errorf("not this set: %w", backend.ErrUnsupported)
	}
	return d.Driver.TryAcquireAll(ctx, cs)
}

func (d *setCounter) ReleaseAll(ctx context.Context, cs []backend.Claim) []error {
	d.releaseAll.Add(1)
	return d.Driver.ReleaseAll(ctx, cs)
}

// Where the store takes a set in one request (backend.SetAcquirer), free
// names cost one request to take and one to release; a held one sends the
// set name by name, and the refusal names it.
func TestLockSetOneRequest(t *testing.T) {
	ctx := context.Background()
	s := memlock.NewStore()
	md, err := memlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	d := &setCounter{Driver: md}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	obs := newClient(t, s)
	names := []string{"d", "c", "b", "a"}
	set, err := c.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if got := free(t, obs, names...); len(got) != 0 {
		t.Fatalf("free while the set holds them: %v", got)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if one, all, rel := d.one.Load(), d.all.Load(), d.releaseAll.Load(); one != 0 || all != 1 || rel != 1 {
		t.Fatalf("requests: %d TryAcquire, %d TryAcquireAll, %d ReleaseAll; want 0, 1, 1", one, all, rel)
	}
	if got := free(t, obs, names...); len(got) != 4 {
		t.Fatalf("free after the release: %v, want all", got)
	}
	held, err := obs.TryAcquire(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquireAll(ctx, names); !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), `"c"`) {
		t.Fatalf("TryAcquireAll with c held: %v, want ErrNotAcquired naming c", err)
	}
	if got := free(t, obs, "a", "b", "d"); len(got) != 3 {
		t.Fatalf("free after the refusal: %v, want a, b, d", got)
	}
	// A wait takes them in order once c is free.
	go func() {
		time.Sleep(50 * time.Millisecond)
		held.Release(ctx)
	}()
	set, err = c.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A set the driver cannot take in one request (backend.ErrUnsupported) is
// taken name by name, waiting or not.
func TestLockSetUnsupportedByDriver(t *testing.T) {
	ctx := context.Background()
	md, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	d := &setCounter{Driver: md, unsupported: true}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, take := range []func(context.Context, []string, ...locker.LockOption) (*locker.LockSet, error){c.TryAcquireAll, c.AcquireAll} {
		set, err := take(ctx, []string{"b", "a"})
		if err != nil {
			t.Fatal(err)
		}
		if err := set.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if one := d.one.Load(); one != 4 {
		t.Fatalf("%d TryAcquire calls for two sets of two, want 4", one)
	}
}

// delayedSession is memlock dressed as a Session driver that keeps
// lock-delays (backend.Delayer), for the core's path of a delayed set.
type delayedSession struct{ *setCounter }

func (delayedSession) SessionTTL() time.Duration { return time.Minute }
func (delayedSession) KeepsDelay() bool          { return true }

// A set with a session's lock-delay is taken name by name: the driver's
// marker is one claim's.
func TestLockSetDelayedSession(t *testing.T) {
	ctx := context.Background()
	md, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	d := delayedSession{&setCounter{Driver: md}}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	set, err := c.TryAcquireAll(ctx, []string{"b", "a", "c"}, locker.LockDelay(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if one, all := d.one.Load(), d.all.Load(); one != 3 || all != 0 {
		t.Fatalf("%d TryAcquire and %d TryAcquireAll calls for a delayed set of three, want 3 and 0", one, all)
	}
}

// shortGrants takes a set whole and answers one grant short (a driver's
// bug); it grants a name again to the token that holds it (as Redis does
// for a later attempt of the same token), and its releases land late.
type shortGrants struct {
	*memlock.Driver
	mu   sync.Mutex
	held map[string]string // key: token, taken by TryAcquireAll
}

func (d *shortGrants) TryAcquireAll(ctx context.Context, cs []backend.Claim) ([]backend.Grant, error) {
	gs, err := d.Driver.TryAcquireAll(ctx, cs)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	for _, c := range cs {
		d.held[c.Key] = c.Token
	}
	d.mu.Unlock()
	return gs[1:], nil
}

func (d *shortGrants) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	d.mu.Lock()
	again := d.held[c.Key] == c.Token
	d.mu.Unlock()
	if again {
		return backend.Grant{Fence: 1, TTL: c.TTL}, nil
	}
	return d.Driver.TryAcquire(ctx, c)
}

func (d *shortGrants) Release(ctx context.Context, c backend.Claim) error {
	time.Sleep(50 * time.Millisecond)
	d.mu.Lock()
	delete(d.held, c.Key)
	d.mu.Unlock()
	return d.Driver.Release(ctx, c)
}

// A driver that answers a set with too few grants fails it: its claims,
// which the Client gives back, are not tried again, or the give-back
// would free names the set goes on to hold.
func TestLockSetShortGrants(t *testing.T) {
	ctx := context.Background()
	s := memlock.NewStore()
	md, err := memlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(&shortGrants{Driver: md, held: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	obs := newClient(t, s)
	names := []string{"a", "b", "c"}
	set, err := c.AcquireAll(ctx, names)
	time.Sleep(200 * time.Millisecond) // the give-backs have landed
	if err == nil {
		got := free(t, obs, names...)
		set.Release(ctx)
		t.Fatalf("AcquireAll returned a set whose names %v are free in the store", got)
	}
	if got := free(t, obs, names...); len(got) != 3 {
		t.Fatalf("after the failed set: %v free, want all", got)
	}
}
