package locker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// lostReply takes its first request's locks in the store but answers with
// an error, as a reply lost on its way back. The driver's undo of that
// request (a release by its tokens, whatever the fence, as PostgreSQL's and
// memcached's drivers send one after a lost reply) lands after the next
// request, as a late one may; a next request under a lost token retakes
// that token's lock first, as those stores do.
type lostReply struct {
	*memlock.Driver
	mu     sync.Mutex
	calls  int
	lost   []backend.Claim
	tokens []string // every claim's, in order
}

func (d *lostReply) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	gs, err := d.TryAcquireAll(ctx, []backend.Claim{c})
	if err != nil {
		return backend.Grant{}, err
	}
	return gs[0], nil
}

func (d *lostReply) TryAcquireAll(ctx context.Context, cs []backend.Claim) ([]backend.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	for _, c := range cs {
		d.tokens = append(d.tokens, c.Token)
	}
	if d.calls == 1 {
		if _, err := d.Driver.TryAcquireAll(ctx, cs); err != nil {
			return nil, err
		}
		d.lost = cs
		return nil, errors.New("read: connection reset by peer")
	}
	lost := d.lost
	d.lost = nil
	for _, l := range lost {
		if slices.ContainsFunc(cs, func(c backend.Claim) bool { return c.Token == l.Token }) {
			_ = d.Driver.Release(ctx, l) // the token's own lock, taken anew
		}
	}
	gs, err := d.Driver.TryAcquireAll(ctx, cs)
	for _, l := range lost {
		_ = d.Driver.Release(context.Background(), l) // the late undo
	}
	return gs, err
}

// TestWaitRetriesUnderANewToken: a wait whose try failed with its fate
// unknown tries again under another token, which that try's undo cannot
// free: under the same one, the undo freed the lock the wait returned, and
// another client took it while the first held it.
func TestWaitRetriesUnderANewToken(t *testing.T) {
	ctx := context.Background()
	for _, set := range []bool{false, true} {
		store := memlock.NewStore()
		d := &lostReply{Driver: memDriver(store)}
		c := newClientOn(t, d)
		other := newClientOn(t, memDriver(store))
		names := []string{"x"}
		var release func(context.Context) error
		if set {
			names = []string{"x", "y"}
			s, err := c.AcquireAll(ctx, names)
			if err != nil {
				t.Fatal(err)
			}
			release = s.Release
		} else {
			l, err := c.Acquire(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			release = l.Release
		}
		d.mu.Lock()
		tokens := d.tokens
		d.mu.Unlock()
		if n := len(names); len(tokens) <= n || slices.Contains(tokens[n:], tokens[0]) {
			t.Errorf("set %v: claims' tokens %v: a try after the failed one reused its token", set, tokens)
		}
		for _, n := range names {
			if _, err := other.TryAcquire(ctx, n); !errors.Is(err, locker.ErrNotAcquired) {
				t.Fatalf("set %v: another client took %q while the first held it: %v", set, n, err)
			}
		}
		if err := release(ctx); err != nil {
			t.Fatalf("set %v: %v", set, err)
		}
	}
}

// writerBlip answers its first Write claim with an error after the store
// has refused it and recorded its token as the waiting writer, as a reply
// lost on its way back.
type writerBlip struct {
	*memlock.Driver
	calls atomic.Int32
}

func (d *writerBlip) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, c)
	if c.Mode == backend.Write && d.calls.Add(1) == 1 && errors.Is(err, backend.ErrNotAcquired) {
		return backend.Grant{}, errors.New("read: connection reset by peer")
	}
	return g, err
}

// TestRetiredWriterTokenLeavesNoRecord: a writer's wait that tries again
// under a new token after a failure withdraws what the failed try may have
// left under the old one: its record of waiting refused readers for a TTL
// after the writer gave up.
func TestRetiredWriterTokenLeavesNoRecord(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	readers := newClient(t, store)
	d := &writerBlip{Driver: memDriver(store)}
	c := newClientOn(t, d, locker.WithBackoff(time.Millisecond, 5*time.Millisecond))
	r1, err := readers.TryAcquire(ctx, "x", locker.Read())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "x", locker.Write(), locker.WaitAtMost(100*time.Millisecond)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("writer: %v, want ErrNotAcquired", err)
	}
	if n := d.calls.Load(); n < 2 {
		t.Fatalf("the writer tried %d times, want a try after the failed one", n)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r2, err := readers.TryAcquire(ctx, "x", locker.Read())
	if err != nil {
		t.Fatalf("a reader after the writer gave up: %v", err)
	}
	r2.Release(ctx)
}
