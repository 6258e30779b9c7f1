package memcachelock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func sharedDriver(t *testing.T) *Driver {
	testenv.Require(t, testenv.MemcacheAddr())
	return openDriver(t, testenv.MemcacheAddr()+suiteQuery)
}

func permit(key string, limit int) backend.Claim {
	return backend.Claim{Key: key, Token: token(), TTL: 10 * time.Second, Mode: backend.Permit, Limit: limit}
}

// A claim of several permits is refused before any request: memcached
// cannot take several slot items at once.
func TestNoWeights(t *testing.T) {
	c, err := locker.New(&Driver{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.TryAcquire(context.Background(), "x", locker.Semaphore(3), locker.Permits(2))
	if !errors.Is(err, locker.ErrUnsupported) {
		t.Fatalf("Permits(2) = %v, want ErrUnsupported", err)
	}
}

// Resize is refused before any request: memcached may drop the limit it
// would keep (an eviction, a restart), and nothing would tell (see
// Resizing in docs/backends/memcachelock.md).
func TestNoResize(t *testing.T) {
	c, err := locker.New(&Driver{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Resize(context.Background(), "x", 2); !errors.Is(err, locker.ErrUnsupported) {
		t.Fatalf("Resize = %v, want ErrUnsupported", err)
	}
}

// Inspect and Break refuse a semaphore or a read-write lock before any
// request (this driver has no client to send one): their holders' items
// record no fence.
func TestNoHolders(t *testing.T) {
	d := &Driver{}
	for _, m := range []backend.Mode{backend.Permit, backend.Read, backend.Write} {
		if _, err := d.Inspect(context.Background(), "a/b", m); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("Inspect(%v) = %v, want ErrUnsupported", m, err)
		}
		if _, err := d.Break(context.Background(), "a/b", m, 1); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("Break(%v) = %v, want ErrUnsupported", m, err)
		}
	}
}

// Permits are bounded by the limit, each grant's fence is above the one
// before, and a release frees a slot.
func TestSemaphoreSlots(t *testing.T) {
	d := sharedDriver(t)
	ctx := testCtx(t, 20*time.Second)
	key := uniqueKey(t, "sem")
	var held []backend.Claim
	var last uint64
	for range 3 {
		c := permit(key, 3)
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatalf("permit %d: %v", len(held), err)
		}
		if g.Fence <= last {
			t.Fatalf("fence %d after %d", g.Fence, last)
		}
		last, c.Fence = g.Fence, g.Fence
		held = append(held, c)
	}
	if _, err := d.TryAcquire(ctx, permit(key, 3)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("fourth permit of 3: %v, want ErrNotAcquired", err)
	}
	for _, c := range held {
		if err := d.Refresh(ctx, c); err != nil {
			t.Fatalf("refresh: %v", err)
		}
	}
	if err := d.Release(ctx, held[1]); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := d.Release(ctx, held[1]); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	c := permit(key, 3)
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatalf("permit after a release: %v", err)
	}
	for _, c := range append([]backend.Claim{held[0], held[2]}, c) {
		if err := d.Release(ctx, c); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	h := &harness{addr: testenv.MemcacheAddr()}
	if n, err := h.Entries(ctx, key); err != nil || n != 0 {
		t.Fatalf("entries after the last release: %d, %v", n, err)
	}
}

// A claim under another limit than the held permits' fails and leaves
// nothing, whichever slots the held permits sit in (a claimant with a
// smaller limit never looks at the larger limit's higher slots).
func TestSemaphoreLimitMismatch(t *testing.T) {
	d := sharedDriver(t)
	ctx := testCtx(t, 30*time.Second)
	h := &harness{addr: testenv.MemcacheAddr()}
	for i := range 10 {
		key := uniqueKey(t, "sem")
		big := permit(key, 7)
		if _, err := d.TryAcquire(ctx, big); err != nil {
			t.Fatal(err)
		}
		for _, limit := range []int{1, 2, 8} {
			_, err := d.TryAcquire(ctx, permit(key, limit))
			if !errors.Is(err, backend.ErrLimitMismatch) {
				t.Fatalf("try %d: limit %d with a permit of 7 held in slot %d: %v, want ErrLimitMismatch", i, limit, backend.OneOf(big.Token, 7), err)
			}
		}
		if n, err := h.Entries(ctx, key); err != nil || n != 1 {
			t.Fatalf("entries: %d, %v; want the permit", n, err)
		}
		if err := d.Release(ctx, big); err != nil {
			t.Fatal(err)
		}
		// Once none is held, the next claim's limit holds.
		small := permit(key, 2)
		if _, err := d.TryAcquire(ctx, small); err != nil {
			t.Fatalf("limit 2 after the last permit of 7 went: %v", err)
		}
		if err := d.Release(ctx, small); err != nil {
			t.Fatal(err)
		}
	}
}

// A permit that expired (a holder that died) leaves its limit record
// behind; a claim of another limit writes over it, since no permit is
// held under it.
func TestSemaphoreStaleLimitRecord(t *testing.T) {
	d := sharedDriver(t)
	ctx := testCtx(t, 20*time.Second)
	key := uniqueKey(t, "sem")
	c := permit(key, 4)
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatal(err)
	}
	mc := memcache.New(testenv.MemcacheAddr())
	defer mc.Close()
	it, err := d.findSlot(ctx, "permit", slotKeys(objBase(key), "s", 4), backend.OneOf(c.Token, 4), c.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.Delete(it.Key); err != nil { // as its expiry would
		t.Fatal(err)
	}
	c2 := permit(key, 2)
	if _, err := d.TryAcquire(ctx, c2); err != nil {
		t.Fatalf("limit 2 over a stale record of 4: %v", err)
	}
	if err := d.Refresh(ctx, c); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("refresh of the expired permit: %v, want ErrNotHeld", err)
	}
	if err := d.Release(ctx, c2); err != nil {
		t.Fatal(err)
	}
}

func rw(key string, m backend.Mode) backend.Claim {
	return backend.Claim{Key: key, Token: token(), TTL: 10 * time.Second, Mode: m}
}

// Readers share; a writer refused by a reader records itself as waiting,
// which keeps new readers out, and Release of its claim withdraws it.
func TestRWWaitingWriter(t *testing.T) {
	d := sharedDriver(t)
	ctx := testCtx(t, 20*time.Second)
	key := uniqueKey(t, "rw")
	r1, r2 := rw(key, backend.Read), rw(key, backend.Read)
	g1, err := d.TryAcquire(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, r2); err != nil {
		t.Fatalf("second reader: %v", err)
	}
	w := rw(key, backend.Write)
	if _, err := d.TryAcquire(ctx, w); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("writer with readers: %v, want ErrNotAcquired", err)
	}
	if _, err := d.TryAcquire(ctx, rw(key, backend.Read)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader behind a waiting writer: %v, want ErrNotAcquired", err)
	}
	for _, c := range []backend.Claim{r1, r2} {
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	gw, err := d.TryAcquire(ctx, w)
	if err != nil {
		t.Fatalf("writer once the readers left: %v", err)
	}
	if gw.Fence <= g1.Fence {
		t.Fatalf("writer's fence %d not above the reader's %d", gw.Fence, g1.Fence)
	}
	if _, err := d.TryAcquire(ctx, rw(key, backend.Read)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader with a writer: %v, want ErrNotAcquired", err)
	}
	w2 := rw(key, backend.Write)
	if _, err := d.TryAcquire(ctx, w2); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second writer: %v, want ErrNotAcquired", err)
	}
	// w2 gives up: its record goes with its Release.
	if err := d.Release(ctx, w2); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("release of the waiting writer: %v, want ErrNotHeld", err)
	}
	if err := d.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
	h := &harness{addr: testenv.MemcacheAddr()}
	if n, err := h.Entries(ctx, key); err != nil || n != 0 {
		t.Fatalf("entries at the end: %d, %v", n, err)
	}
	r3 := rw(key, backend.Read)
	if _, err := d.TryAcquire(ctx, r3); err != nil {
		t.Fatalf("reader once all left: %v", err)
	}
	_ = d.Release(ctx, r3)
}

// At most MaxReaders readers at once; one more is refused with the reason.
func TestRWMaxReaders(t *testing.T) {
	d := sharedDriver(t)
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t, "rw")
	var held []backend.Claim
	defer func() {
		for _, c := range held {
			_ = d.Release(context.Background(), c)
		}
	}()
	for range MaxReaders {
		c := rw(key, backend.Read)
		if _, err := d.TryAcquire(ctx, c); err != nil {
			t.Fatalf("reader %d: %v", len(held), err)
		}
		held = append(held, c)
	}
	_, err := d.TryAcquire(ctx, rw(key, backend.Read))
	var why *backend.NotAcquiredError
	if !errors.As(err, &why) {
		t.Fatalf("reader %d: %v, want a NotAcquiredError", MaxReaders+1, err)
	}
}

// Through the Client: a waiting writer gets in before a stream of
// readers, with a fence above theirs.
func TestRWWriterFirstThroughClient(t *testing.T) {
	d := sharedDriver(t)
	ns := "mctest" + randHex(4)
	c, err := locker.New(d, locker.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 20*time.Second)
	r, err := c.TryAcquire(ctx, "doc", locker.Read())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		w, err := c.Acquire(ctx, "doc", locker.Write())
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	// Wait (bounded) until the writer's record is there.
	qk := objKey(backend.Key(ns, "doc"), "q")
	mc := memcache.New(testenv.MemcacheAddr())
	defer mc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := mc.Get(qk); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no record of the waiting writer within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.TryAcquire(ctx, "doc", locker.Read()); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("reader behind a waiting writer: %v", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		return
	}
	if w.Fence() <= r.Fence() {
		t.Fatalf("writer's fence %d not above the reader's %d", w.Fence(), r.Fence())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Under contention from two drivers, 8 goroutines each, with limits 2
// and 3 asked for at once: never more permits than the limit, never both
// limits held at once, and the semaphore left empty.
func TestSemaphoreContention(t *testing.T) {
	ds := []*Driver{sharedDriver(t), sharedDriver(t)}
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t, "sem")
	var mu sync.Mutex
	inside := map[int]int{} // by limit
	grants := 0
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := ds[g%2]
			limit := 2 + g%4/3 // mostly 2, some 3
			for i := 0; i < 200 && time.Now().Before(stop); i++ {
				c := permit(key, limit)
				gr, err := d.TryAcquire(ctx, c)
				if err != nil {
					if !errors.Is(err, backend.ErrNotAcquired) && !errors.Is(err, backend.ErrLimitMismatch) {
						t.Error(err)
						return
					}
					continue
				}
				c.Fence = gr.Fence
				mu.Lock()
				inside[limit]++
				grants++
				n, other := inside[limit], inside[5-limit]
				mu.Unlock()
				if n > limit || other > 0 {
					t.Errorf("%d permits of %d held, and %d of the other limit", n, limit, other)
				}
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside[limit]--
				mu.Unlock()
				if err := d.Release(ctx, c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if grants < 10 {
		t.Errorf("only %d grants", grants)
	}
	h := &harness{addr: testenv.MemcacheAddr()}
	if n, err := h.Entries(ctx, key); err != nil || n != 0 {
		t.Fatalf("entries at the end: %d, %v", n, err)
	}
	t.Logf("%d grants", grants)
}

// Under contention from two drivers, 8 goroutines each, a quarter of them
// writers: a writer is alone, fences grow with each writer, and every
// writer gets in.
func TestRWContention(t *testing.T) {
	ds := []*Driver{sharedDriver(t), sharedDriver(t)}
	ctx := testCtx(t, 30*time.Second)
	key := uniqueKey(t, "rw")
	var mu sync.Mutex
	readers, writers, reads, writes := 0, 0, 0, 0
	var last uint64
	var wg sync.WaitGroup
	// Writers are preferred: four writers that retry at once keep readers
	// out for as long as they run, so each writes a bounded number of
	// times, and readers go on until the writers are done (and 3s have
	// passed): both modes are exercised however slow the machine.
	const writesEach = 10
	stop := time.Now().Add(3 * time.Second)
	var writersLeft atomic.Int32
	writersLeft.Store(4)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := ds[g%2]
			mode := backend.Read
			if g%4 == 0 {
				mode = backend.Write
				defer writersLeft.Add(-1)
			}
			done := 0
			for i := 0; i < 10000 && ctx.Err() == nil; i++ {
				if mode == backend.Write && done == writesEach ||
					mode == backend.Read && !time.Now().Before(stop) && writersLeft.Load() == 0 {
					return
				}
				c := rw(key, mode)
				gr, err := d.TryAcquire(ctx, c)
				if err != nil {
					if !errors.Is(err, backend.ErrNotAcquired) {
						t.Error(err)
						return
					}
					if mode == backend.Write {
						// As the locker package does when a writer gives
						// up: withdraw its record of waiting.
						_ = d.Release(ctx, c)
					}
					time.Sleep(time.Millisecond)
					continue
				}
				c.Fence = gr.Fence
				done++
				mu.Lock()
				if mode == backend.Write {
					writers++
					writes++
					if gr.Fence <= last {
						t.Errorf("writer's fence %d not above %d", gr.Fence, last)
					}
				} else {
					readers++
					reads++
				}
				last = max(last, gr.Fence)
				if writers > 1 || writers == 1 && readers > 0 {
					t.Errorf("%d writers and %d readers at once", writers, readers)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				if mode == backend.Write {
					writers--
				} else {
					readers--
				}
				mu.Unlock()
				if err := d.Release(ctx, c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if writes != 4*writesEach || reads == 0 {
		t.Errorf("%d writes (want %d) and %d reads", writes, 4*writesEach, reads)
	}
	t.Logf("%d writes, %d reads", writes, reads)
}
