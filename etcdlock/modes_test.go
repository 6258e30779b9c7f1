package etcdlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestModesApart: a name's lock, semaphore and read-write lock are held
// at once, each excludes only its own kind, and List sees each kind
// apart.
func TestModesApart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	a, _ := h.client(t)
	b, _ := h.client(t)
	kinds := [][]locker.LockOption{nil, {locker.Semaphore(1)}, {locker.Write()}}
	var held []*locker.Lock
	for _, opts := range kinds {
		l, err := a.TryAcquire(ctx, "apart", opts...)
		if err != nil {
			t.Fatalf("TryAcquire %v: %v", opts, err)
		}
		held = append(held, l)
	}
	for _, opts := range append(kinds, []locker.LockOption{locker.Read()}) {
		if _, err := b.TryAcquire(ctx, "apart", opts...); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire %v by another client = %v, want ErrNotAcquired", opts, err)
		}
	}
	sts, err := b.List(ctx, "")
	if err != nil || len(sts) != 1 || sts[0].Name != "apart" || sts[0].Fence != held[0].Fence() {
		t.Fatalf("List = %+v, %v; want the lock alone, fence %d", sts, err, held[0].Fence())
	}
	for i, opts := range kinds[1:] {
		sts, err := b.List(ctx, "", opts...)
		if err != nil || len(sts) != 1 || len(sts[0].Holders) != 1 || sts[0].Holders[0].Fence != held[i+1].Fence() {
			t.Fatalf("List %v = %+v, %v; want its own kind alone, fence %d", opts, sts, err, held[i+1].Fence())
		}
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := h.Residue(ctx, backend.Key("t", "apart")); err != nil || n != 0 {
		t.Fatalf("Residue after release = %d, %v; want 0", n, err)
	}
}

// TestModesMinHold: a permit or a writer released within MinHold, by a
// client that then closes (revoking its session), stays held until
// MinHold has passed, like a lock (Linger moves the entry to a lease of
// its own).
func TestModesMinHold(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	for _, tc := range []struct {
		name       string
		hold, want locker.LockOption
	}{
		{"permit", locker.Semaphore(1), locker.Semaphore(1)},
		{"writer", locker.Write(), locker.Read()},
		{"reader", locker.Read(), locker.Write()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 60*time.Second)
			a, _ := h.client(t)
			b, _ := h.client(t)
			const mh = 4 * time.Second
			// Before the request: MinHold counts from the grant, after it.
			acquired := time.Now()
			l, err := a.TryAcquire(ctx, tc.name, tc.hold, locker.MinHold(mh))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release within MinHold: %v", err)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			for n := 0; time.Since(acquired) < mh-time.Second && n < 100; n++ {
				if _, err := b.TryAcquire(ctx, tc.name, tc.want); !errors.Is(err, locker.ErrNotAcquired) {
					t.Fatalf("TryAcquire %v after the acquisition, within MinHold %v, after the holder closed = %v, want ErrNotAcquired", time.Since(acquired), mh, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			n, err := b.Acquire(testCtx(t, mh+5*time.Second), tc.name, tc.want)
			if err != nil {
				t.Fatalf("Acquire after MinHold: %v", err)
			}
			took := time.Since(acquired)
			t.Logf("free %v after the acquisition (MinHold %v)", took, mh)
			if took < mh-time.Second/10 {
				t.Errorf("free after %v, before MinHold %v", took, mh)
			}
			if n.Fence() <= l.Fence() {
				t.Errorf("fence %d after MinHold, not above %d", n.Fence(), l.Fence())
			}
			if err := n.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPermitMismatchWhileQueued: a blocking Acquire under another limit
// than the held permits' fails at once with ErrLimitMismatch and leaves no
// entry, though it had queued one.
func TestPermitMismatchWhileQueued(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	a, _ := h.client(t)
	b, _ := h.client(t)
	for range 2 {
		if _, err := a.TryAcquire(ctx, "mismatch", locker.Semaphore(2)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	_, err := b.Acquire(testCtx(t, 10*time.Second), "mismatch", locker.Semaphore(3))
	if !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("Acquire with limit 3 behind 2 permits of 2 = %v, want ErrLimitMismatch", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("ErrLimitMismatch after %v: it waited", took)
	}
	if n, err := h.Entries(ctx, backend.Key("t", "mismatch")); err != nil || n != 2 {
		t.Fatalf("entries after the mismatch = %d, %v; want the 2 permits", n, err)
	}
}

// TestBadClaimsRefused: a limit out of range or an unknown mode is a typed
// error from the driver itself, before any request.
func TestBadClaimsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 10*time.Second)
	tok := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		c    backend.Claim
		want error
	}{
		{backend.Claim{Key: "k", Token: tok, TTL: time.Second, Mode: backend.Permit}, backend.ErrInvalidLimit},
		{backend.Claim{Key: "k", Token: tok, TTL: time.Second, Mode: backend.Permit, Limit: backend.MaxLimit + 1}, backend.ErrInvalidLimit},
		{backend.Claim{Key: "k", Token: tok, TTL: time.Second, Mode: backend.Mode(9)}, backend.ErrUnsupported},
	} {
		for _, acquire := range []func(context.Context, backend.Claim) (backend.Grant, error){h.probe.TryAcquire, func(ctx context.Context, c backend.Claim) (backend.Grant, error) {
			g, _, err := h.probe.Enqueue(ctx, c)
			return g, err
		}} {
			if _, err := acquire(ctx, tc.c); !errors.Is(err, tc.want) {
				t.Errorf("acquire %v limit %d = %v, want %v", tc.c.Mode, tc.c.Limit, err, tc.want)
			}
		}
	}
	if n, err := h.Residue(ctx, "k"); err != nil || n != 0 {
		t.Errorf("Residue = %d, %v; want 0", n, err)
	}
}

// TestModeWaiterLeaseRevoked: a permit's, a reader's or a writer's waiter
// whose lease is revoked queues again with a new lease, and still gets in
// once the holder leaves.
func TestModeWaiterLeaseRevoked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	for _, tc := range []struct {
		name       string
		hold, wait locker.LockOption
	}{
		{"permit", locker.Semaphore(1), locker.Semaphore(1)},
		{"reader", locker.Write(), locker.Read()},
		{"writer", locker.Read(), locker.Write()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 30*time.Second)
			key := backend.Key("t", tc.name)
			c1, _ := h.client(t)
			c2, d2 := h.client(t)
			l, err := c1.TryAcquire(ctx, tc.name, tc.hold)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				w, err := c2.Acquire(ctx, tc.name, tc.wait)
				if err == nil {
					w.Release(ctx)
				}
				got <- err
			}()
			lease := func() clientv3.LeaseID {
				d2.mu.Lock()
				defer d2.mu.Unlock()
				var id clientv3.LeaseID
				for _, ls := range d2.leases {
					id = ls.id
				}
				return id
			}
			var id clientv3.LeaseID
			for deadline := time.Now().Add(5 * time.Second); id == 0; {
				if n, _ := h.Entries(ctx, key); n == 2 {
					id = lease()
				} else if time.Now().After(deadline) {
					t.Fatal("the waiter did not queue")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := h.admin.Revoke(ctx, id); err != nil {
				t.Fatal(err)
			}
			// The waiter learns of it from its next keep-alive (TTL/3), and
			// queues again.
			for deadline := time.Now().Add(3 * time.Second); ; {
				nu := lease()
				n, _ := h.Entries(ctx, key)
				if n == 2 && nu != id && nu != 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d entries 3s after the waiter's lease was revoked, want 2: it queues again", n)
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case err := <-got:
				t.Fatalf("the waiter returned while the holder holds: %v", err)
			default:
			}
			l.Release(ctx)
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("waiter: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter did not get in")
			}
			if n, err := h.Residue(ctx, key); err != nil || n != 0 {
				t.Errorf("Residue after both left = %d, %v; want 0", n, err)
			}
		})
	}
}

// TestPermitted: an entry holds while the permits of those ahead and its
// own fit the limit, the resized one (r) if it stands, whatever the
// entries' own, or if it is one of the resize record's holders; an owner
// with a '/' is no weight.
func TestPermitted(t *testing.T) {
	kv := func(k, v string, rev int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(k), Value: []byte(v), CreateRevision: rev}
	}
	kvs := []*mvccpb.KeyValue{kv("a", permitValue(5, 3, "x"), 1), kv("b", permitValue(5, 1, "y/9"), 2), kv("me", "", 3)}
	for _, c := range []struct {
		limit, weight, r int
		ok, mismatch     bool
	}{
		{5, 1, 0, true, false}, {5, 2, 0, false, false}, {4, 1, 0, false, true},
		{5, 2, 6, true, false}, {4, 1, 5, true, false}, {9, 1, 4, false, false}, {5, 5, 4, false, true},
	} {
		got, err := permitted(kvs, "me", c.limit, c.weight, record{limit: c.r})
		if errors.Is(err, backend.ErrLimitMismatch) != c.mismatch || (got != nil) != c.ok {
			t.Errorf("permitted(%d of %d, resized to %d, behind 3 and 1 of 5) = %v, %v; want granted %v, mismatch %v", c.weight, c.limit, c.r, got, err, c.ok, c.mismatch)
		}
	}
	if got, err := permitted(kvs, "me", 9, 5, record{limit: 4, upto: 3}); got == nil || err != nil {
		t.Errorf("permitted(5 of 9, resized to 4 with it among the holders) = %v, %v; want granted", got, err)
	}
	if n, w := permitOf(kvs[1]); n != 5 || w != 1 {
		t.Errorf("permitOf(%q) = %d, %d, want 5, 1", kvs[1].Value, n, w)
	}
}

// TestResizedRule: the entries up to a resize record's last holder
// hold whatever its limit; the others under its limit, or, a removed
// one's, while every entry ahead has their own.
func TestResizedRule(t *testing.T) {
	var kvs []*mvccpb.KeyValue
	for i, limit := range []int{3, 3, 1, 3} { // the third taken under a limit raised to 3
		kvs = append(kvs, &mvccpb.KeyValue{Value: []byte(permitValue(limit, 1, "o")), CreateRevision: int64(i + 1)})
	}
	for _, c := range []struct {
		r    record
		want int
	}{
		{record{}, 2}, {record{upto: 3}, 3}, {record{limit: 2}, 2}, {record{limit: 2, upto: 3}, 3}, {record{limit: 5, upto: 1}, 4},
	} {
		if got := holding(backend.Permit, kvs, c.r); got != c.want {
			t.Errorf("holding(limits 3, 3, 1, 3, record %+v) = %d, want %d", c.r, got, c.want)
		}
	}
}

// TestResized: a free semaphore's limit is set, once in the store however
// often it is asked for, and Inspect reports it with nothing held; tries
// of a smaller claimed limit fill the resized one (beyond the entries
// their transaction reads: one more read); List judges the holders under
// it; once it is removed, the claims' own limits rule again, and the name
// leaves nothing.
func TestResized(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c, d := h.client(t)
	key := backend.Key("t", "r")
	rk := resizeKey(h.dirs(key)[1])
	var mods []int64
	for range 2 {
		if err := c.Resize(ctx, "r", 3); err != nil {
			t.Fatal(err)
		}
		resp, err := h.admin.Get(ctx, rk)
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3 0" || resp.Kvs[0].Lease != 0 {
			t.Fatalf("the resize key: %+v, %v; want 3, no holder, without a lease", resp, err)
		}
		mods = append(mods, resp.Kvs[0].ModRevision)
	}
	if mods[0] != mods[1] {
		t.Errorf("a Resize to the limit that stands wrote it again (revisions %v)", mods)
	}
	if st, err := d.Inspect(ctx, key, backend.Permit); err != nil || st.Held || st.Limit != 3 {
		t.Fatalf("Inspect of a free resized semaphore = %+v, %v; want Limit 3, not held", st, err)
	}
	one := locker.Semaphore(1)
	var held []*locker.Lock
	for i := range 3 {
		l, err := c.TryAcquire(ctx, "r", one)
		if err != nil {
			t.Fatalf("TryAcquire %d of a semaphore of 1 resized to 3: %v", i+1, err)
		}
		held = append(held, l)
	}
	if _, err := c.TryAcquire(ctx, "r", one); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("a 4th TryAcquire = %v, want ErrNotAcquired", err)
	}
	if sts, err := c.List(ctx, "r", one); err != nil || len(sts) != 1 || sts[0].Limit != 3 || len(sts[0].Holders) != 3 {
		t.Fatalf("List = %+v, %v; want 3 holders under limit 3", sts, err)
	}
	if err := c.Resize(ctx, "r", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, "r", locker.Semaphore(3)); !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("TryAcquire under 3 with permits held under 1 and the resize removed = %v, want ErrLimitMismatch", err)
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The removed limit's record kept its holders; the next claim finds
	// them gone and deletes it.
	if l, err := c.TryAcquire(ctx, "r", locker.Semaphore(3)); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Residue(ctx, key); err != nil || n != 0 {
		t.Fatalf("Residue after Resize 0 and the releases = %d, %v; want 0", n, err)
	}

	// Lowered below the holders' permits: they all hold, and a claim
	// behind them waits.
	heavy, err := c.TryAcquire(ctx, "low", locker.Semaphore(4), locker.Permits(3))
	if err != nil {
		t.Fatal(err)
	}
	light, err := c.TryAcquire(ctx, "low", locker.Semaphore(4))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, "low", 2); err != nil {
		t.Fatal(err)
	}
	defer c.Resize(ctx, "low", 0)
	st, err := d.Inspect(ctx, backend.Key("t", "low"), backend.Permit)
	if err != nil || !st.Held || st.Limit != 2 || len(st.Holders) != 2 || st.Holders[1].Fence != light.Fence() || st.Waiters != 0 {
		t.Fatalf("Inspect after lowering 4 to 2 under 3 and 1 permits = %+v, %v; want both held, limit 2", st, err)
	}
	if _, err := c.TryAcquire(ctx, "low", locker.Semaphore(2)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire behind 4 permits held under a limit lowered to 2 = %v, want ErrNotAcquired", err)
	}
	for _, l := range []*locker.Lock{heavy, light} {
		if err := l.Refresh(ctx); err != nil {
			t.Fatalf("Refresh of a holder above the lowered limit: %v", err)
		}
	}
}

// TestResizedHolders: the reviewer's case. Of a semaphore of 3, A and B
// leave after W queued, Y takes the permit left, and the limit is lowered
// to 2: C, W and Y all hold (W's wait succeeds, by the store's rule), and
// Inspect lists the three, Y's fence frees Y. Likewise, permits taken
// under a raised limit stay held once Resize 0 lets the claims' own
// limits rule again.
func TestResizedHolders(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c, _ := h.client(t)
	take3 := func(name string, sem locker.LockOption) (ls []*locker.Lock) {
		for range 3 {
			l, err := c.TryAcquire(ctx, name, sem)
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		}
		return ls
	}
	three := locker.Semaphore(3)
	abc := take3("s", three)
	defer c.Resize(ctx, "s", 0)
	wc, _ := h.client(t)
	got := make(chan *locker.Lock, 1)
	go func() {
		w, err := wc.Acquire(ctx, "s", three)
		if err != nil {
			t.Errorf("W's Acquire: %v", err)
		}
		got <- w
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := c.Inspect(ctx, "s", three)
		if err == nil && st.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("W never queued: %+v, %v", st, err)
		}
	}
	for _, l := range abc[:2] {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	y, err := c.TryAcquire(ctx, "s", three)
	if err != nil {
		t.Fatalf("Y's TryAcquire beside C and W of 3: %v", err)
	}
	if err := c.Resize(ctx, "s", 2); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		t.FailNow()
	}
	fences := func(st locker.State) (fs []uint64) {
		for _, h := range st.Holders {
			fs = append(fs, h.Fence)
		}
		return fs
	}
	want := []uint64{abc[2].Fence(), w.Fence(), y.Fence()}
	if st, err := c.Inspect(ctx, "s", three); err != nil || !slices.Equal(fences(st), want) || st.Waiters != 0 || st.Limit != 2 {
		t.Fatalf("Inspect after lowering to 2 under C, W, Y = %+v, %v; want holders %v, no waiter, limit 2", st, err, want)
	}
	if _, err := c.ForceRelease(ctx, "s", y.Fence(), three); err != nil {
		t.Fatalf("ForceRelease of Y, a holder above the lowered limit: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "s", three); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire with C and W holding 2 of 2 = %v, want ErrNotAcquired", err)
	}

	// Raised above the claims' limit, then removed: the permits taken
	// under it are held still.
	one := locker.Semaphore(1)
	if err := c.Resize(ctx, "u", 3); err != nil {
		t.Fatal(err)
	}
	us := take3("u", one)
	if err := c.Resize(ctx, "u", 0); err != nil {
		t.Fatal(err)
	}
	want = []uint64{us[0].Fence(), us[1].Fence(), us[2].Fence()}
	if st, err := c.Inspect(ctx, "u", one); err != nil || !slices.Equal(fences(st), want) || st.Waiters != 0 {
		t.Fatalf("Inspect after raising 1 to 3, 3 taken, and Resize 0 = %+v, %v; want holders %v, no waiter", st, err, want)
	}
	if _, err := c.ForceRelease(ctx, "u", us[2].Fence(), one); err != nil {
		t.Fatalf("ForceRelease of a permit taken under a removed limit: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "u", one); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of 1 with 2 permits held = %v, want ErrNotAcquired", err)
	}
}

// TestResizedRacing: claims come and go while the limit is lowered and
// raised again and again; after each lowering, Inspect lists every permit
// held from before it began to after it returned, though some were taken
// under the old limit while Resize wrote the new one.
func TestResizedRacing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 60*time.Second)
	c, _ := h.client(t)
	defer c.Resize(ctx, "s", 0)
	type hold struct {
		fence    uint64
		from, to time.Time // to: zero while held
	}
	var (
		mu    sync.Mutex
		holds []*hold
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for range 4 {
		cc, _ := h.client(t)
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l, err := cc.TryAcquire(ctx, "s", locker.Semaphore(3))
				if err != nil {
					continue
				}
				hd := &hold{fence: l.Fence(), from: time.Now()}
				mu.Lock()
				holds = append(holds, hd)
				mu.Unlock()
				time.Sleep(time.Duration(i%4) * 5 * time.Millisecond)
				mu.Lock()
				hd.to = time.Now()
				mu.Unlock()
				l.Release(ctx)
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	for range 40 {
		if err := c.Resize(ctx, "s", 2); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		st, err := c.Inspect(ctx, "s", locker.Semaphore(3))
		end := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		for _, h := range st.Holders {
			seen[h.Fence] = true
		}
		mu.Lock()
		for _, hd := range holds {
			if hd.from.Before(start) && (hd.to.IsZero() || hd.to.After(end)) && !seen[hd.fence] {
				t.Errorf("fence %d, held from %v to %v, is missing from Inspect's holders %+v", hd.fence, hd.from, hd.to, st.Holders)
			}
		}
		mu.Unlock()
		if err := c.Resize(ctx, "s", 3); err != nil {
			t.Fatal(err)
		}
	}
}
