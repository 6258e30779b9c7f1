package locker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// queuedBlip is a memlock driver whose first claim labelled "a" takes its
// lock in the store but answers with an error, as a reply lost on its way
// back, once the test lets it go on (stall); the driver's undo of it (a
// release by its token) lands after the next "a" claim, which retakes the
// token's lock first if it is the same token, as PostgreSQL and memcached
// do. Claims labelled "b" are refused while refuse is set.
type queuedBlip struct {
	*memlock.Driver
	entered, stall chan struct{}
	mu             sync.Mutex
	calls          int
	refuse         bool
	lost           *backend.Claim
	tokens         []string // the "a" claims', in order
}

func (d *queuedBlip) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	d.mu.Lock()
	if c.Owner == "b" {
		refuse := d.refuse
		d.mu.Unlock()
		if refuse {
			return backend.Grant{}, backend.ErrNotAcquired
		}
		return d.Driver.TryAcquire(ctx, c)
	}
	d.calls++
	d.tokens = append(d.tokens, c.Token)
	if d.calls == 1 {
		d.mu.Unlock()
		close(d.entered)
		<-d.stall
		if _, err := d.Driver.TryAcquire(ctx, c); err != nil {
			return backend.Grant{}, err
		}
		d.mu.Lock()
		d.lost = &c
		d.mu.Unlock()
		return backend.Grant{}, errors.New("read: connection reset by peer")
	}
	defer d.mu.Unlock()
	lost := d.lost
	d.lost = nil
	if lost != nil && lost.Token == c.Token {
		_ = d.Driver.Release(ctx, *lost) // the token's own lock, taken anew
	}
	g, err := d.Driver.TryAcquire(ctx, c)
	if lost != nil {
		_ = d.Driver.Release(context.Background(), *lost) // the late undo
	}
	return g, err
}

// TestWaitBehindAnotherRetriesUnderANewToken: a wait whose first try, made
// before it joined the turnstile, failed with its fate unknown, and which
// then found another waiter of its Client ahead of it, tries again under
// another token when its turn comes: under the same one, that try's late
// undo freed the lock the wait returned, and another client took it while
// the first held it.
func TestWaitBehindAnotherRetriesUnderANewToken(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	md, err := memlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	d := &queuedBlip{Driver: md, entered: make(chan struct{}), stall: make(chan struct{}), refuse: true}
	c, err := New(d, WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	od, err := memlock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(od)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	type result struct {
		l   *Lock
		err error
	}
	got := make(chan result, 1)
	go func() { // A: its first try, before any turnstile, stalls
		l, err := c.Acquire(ctx, "x", Label("a"))
		got <- result{l, err}
	}()
	<-d.entered
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	bdone := make(chan error, 1)
	go func() { // B: refused, it waits first in the turnstile
		_, err := c.Acquire(bctx, "x", Label("b"))
		bdone <- err
	}()
	waitFor(t, func() bool { return c.waiting.Load() == 1 })
	close(d.stall) // A's try takes the lock, its reply is lost
	waitFor(t, func() bool { return c.waiting.Load() == 2 })
	cancelB() // A's turn comes
	if err := <-bdone; !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("B: %v", err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("A: no grant in 10s")
	}
	if r.err != nil {
		t.Fatalf("A: %v", r.err)
	}
	defer r.l.Release(ctx)
	d.mu.Lock()
	tokens := d.tokens
	d.mu.Unlock()
	for _, tok := range tokens[1:] {
		if tok == tokens[0] {
			t.Errorf("A's tries' tokens %v: a try after the failed one reused its token", tokens)
		}
	}
	if l, err := other.TryAcquire(ctx, "x"); !errors.Is(err, ErrNotAcquired) {
		if l != nil {
			l.Release(ctx)
		}
		t.Fatalf("another client took x while A held it: %v", err)
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
