package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func modalDriver(t *testing.T) (*Driver, *redis.Client) {
	testenv.Require(t, testenv.RedisAddr())
	d, err := Open(testCtx(t), "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, adminClient(t, testenv.RedisAddr())
}

// TestSharedObjectsApart: a key's lock, semaphore and read-write lock are
// three objects, each with its fence, and none is left once released.
func TestSharedObjectsApart(t *testing.T) {
	d, admin := modalDriver(t)
	ctx := testCtx(t)
	key := uniqueKey(t)
	claims := []backend.Claim{
		{Key: key, Token: newToken(), TTL: time.Minute},
		{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 1},
		{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Write},
	}
	for i := range claims {
		if _, err := d.TryAcquire(ctx, claims[i]); err != nil {
			t.Fatalf("%s: %v", claims[i].Mode, err)
		}
	}
	for _, c := range claims {
		if err := d.Refresh(ctx, c); err != nil {
			t.Fatalf("refresh %s: %v", c.Mode, err)
		}
		if err := d.Release(ctx, c); err != nil {
			t.Fatalf("release %s: %v", c.Mode, err)
		}
	}
	if n, err := residue(ctx, admin, key); err != nil || n != 3 {
		// The three fence counters stay for their retention, nothing else.
		t.Fatalf("residue %d (%v), want the 3 fence counters", n, err)
	}
}

// TestSemaphoreSlots: at most limit permits; a mismatched limit fails and
// leaves nothing; a permit whose time ran out on the server frees its slot.
func TestSemaphoreSlots(t *testing.T) {
	d, admin := modalDriver(t)
	ctx := testCtx(t)
	key := uniqueKey(t)
	permit := func(ttl time.Duration, limit int) backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: ttl, Mode: backend.Permit, Limit: limit}
	}
	// b's 2s leave the checks below ample time before it runs out.
	a, b := permit(time.Minute, 2), permit(2*time.Second, 2)
	ga, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	bSent := time.Now()
	gb, err := d.TryAcquire(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if gb.Fence <= ga.Fence {
		t.Fatalf("fences %d then %d", ga.Fence, gb.Fence)
	}
	if _, err := d.TryAcquire(ctx, permit(time.Minute, 2)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v", err)
	}
	bad := permit(time.Minute, 3)
	if _, err := d.TryAcquire(ctx, bad); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("limit 3 against 2: %v", err)
	}
	if n, err := admin.ZCard(ctx, sharedKeys(a)[0]).Result(); err != nil || n != 2 {
		t.Fatalf("%d holders (%v), want 2", n, err)
	}
	time.Sleep(time.Until(bSent.Add(2100 * time.Millisecond))) // b's time runs out
	if err := d.Refresh(ctx, b); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("refresh of an expired permit: %v", err)
	}
	gc, err := d.TryAcquire(ctx, permit(time.Minute, 2))
	if err != nil {
		t.Fatalf("permit after expiry: %v", err)
	}
	if gc.Fence <= gb.Fence {
		t.Fatalf("fences %d then %d", gb.Fence, gc.Fence)
	}
}

// TestWeightsComeBack: the permits of a holder of several come back
// whole when it releases and when its time runs out on the server, while
// another holder keeps the semaphore's keys alive.
func TestWeightsComeBack(t *testing.T) {
	d, _ := modalDriver(t)
	ctx := testCtx(t)
	key := uniqueKey(t)
	permits := func(ttl time.Duration, n int) backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: ttl, Mode: backend.Permit, Limit: 4, Weight: n}
	}
	if _, err := d.TryAcquire(ctx, permits(time.Minute, 1)); err != nil {
		t.Fatal(err)
	}
	a := permits(time.Minute, 3)
	if _, err := d.TryAcquire(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, permits(time.Minute, 1)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a fifth permit of 4: %v", err)
	}
	if err := d.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := permits(300*time.Millisecond, 3)
	if _, err := d.TryAcquire(ctx, b); err != nil {
		t.Fatalf("3 permits after a holder of 3 released: %v", err)
	}
	time.Sleep(400 * time.Millisecond) // b's time runs out
	if _, err := d.TryAcquire(ctx, permits(time.Minute, 3)); err != nil {
		t.Fatalf("3 permits after a holder of 3 expired: %v", err)
	}
}

// TestSharedCleanupKeepsLaterAttempt: cleaning up after a failed attempt
// (its reply lost) removes that attempt's permit, never a later one's.
func TestSharedCleanupKeepsLaterAttempt(t *testing.T) {
	d, _ := modalDriver(t)
	ctx := testCtx(t)
	c := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 1}
	n := attempts.Load() // an attempt before the next TryAcquire's
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatal(err)
	}
	d.dep.cleanupShared(ctx, c, n)
	if err := d.Refresh(ctx, c); err != nil {
		t.Fatalf("the earlier attempt's clean-up removed the grant: %v", err)
	}
	d.dep.cleanupShared(ctx, c, attempts.Load())
	if err := d.Refresh(ctx, c); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("after its own attempt's clean-up: %v", err)
	}
}

// TestRWWaitingWriter: a waiting writer holds later readers back until it
// gets in, or gives up; a writer's TryAcquire that fails leaves nothing.
func TestRWWaitingWriter(t *testing.T) {
	d, _ := modalDriver(t)
	ctx := testCtx(t)
	key := uniqueKey(t)
	rw := func(m backend.Mode) backend.Claim {
		return backend.Claim{Key: key, Token: newToken(), TTL: time.Minute, Mode: m}
	}
	r1, w := rw(backend.Read), rw(backend.Write)
	if _, err := d.TryAcquire(ctx, r1); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, w); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("writer with a reader: %v", err)
	}
	r2 := rw(backend.Read)
	if _, err := d.TryAcquire(ctx, r2); err != nil {
		t.Fatalf("reader after a writer's failed try: %v", err)
	}
	if err := d.Release(ctx, r2); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := queueAcquire(wctx, d, w)
		done <- err
	}()
	// Bounded: the writer queues within a round trip or two.
	for deadline := time.Now().Add(5 * time.Second); ; {
		r := rw(backend.Read)
		_, err := d.TryAcquire(ctx, r)
		if errors.Is(err, backend.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("readers still enter 5s after a writer began to wait")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("the writer's cancelled Acquire: %v", err)
	}
	r3 := rw(backend.Read)
	if _, err := d.TryAcquire(ctx, r3); err != nil {
		t.Fatalf("reader after the writer gave up: %v", err)
	}
	for _, c := range []backend.Claim{r1, r3} {
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	g, err := queueAcquire(ctx, d, w)
	if err != nil {
		t.Fatalf("writer once readers left: %v", err)
	}
	if _, err := d.TryAcquire(ctx, rw(backend.Read)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("reader with a writer: %v", err)
	}
	if _, err := d.TryAcquire(ctx, rw(backend.Write)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second writer: %v", err)
	}
	if g.Fence == 0 {
		t.Fatal("no fence")
	}
	if err := d.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreClient: through a Client, a blocked permit waits while the
// only permit is held and gets it once released.
func TestSemaphoreClient(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := testCtx(t)
	newClient := func() *locker.Client {
		d, err := Open(ctx, "redis://"+testenv.RedisAddr()+"/0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1, c2 := newClient(), newClient()
	name := "sem-" + randHex(4)
	l1, err := c1.Acquire(ctx, name, locker.Semaphore(1))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c2.Acquire(ctx, name, locker.Semaphore(1))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second permit of 1 granted while held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the freed permit")
	}
}

// TestSecureSharedACL: a user with ACL and SharedACL takes permits, reads
// and writes; without SharedACL, a permit fails with ErrPermission.
func TestSecureSharedACL(t *testing.T) {
	s := newSecured(t)
	ctx := testCtx(t)
	ns := "sec-" + randHex(4)
	k := backend.Key(ns, "job/1 {x}")
	for _, name := range append(fairSharedKeys(backend.Claim{Key: k, Mode: backend.Permit}), fairSharedKeys(backend.Claim{Key: k, Mode: backend.Read})...) {
		var pats []string
		for _, r := range strings.Fields(SharedACL(ns)) {
			if strings.HasPrefix(r, "~") {
				pats = append(pats, r[1:])
			}
		}
		if !globAny(pats, name) {
			t.Errorf("no key pattern of SharedACL matches %q", name)
		}
	}
	for _, fair := range []bool{false, true} {
		user, pw := s.user(t, ACL(ns, fair)+" "+SharedACL(ns))
		c, err := s.client(ctx, user, pw, ns, fair)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i, opts := range [][]locker.LockOption{{locker.Semaphore(2), locker.Permits(2)}, {locker.Read()}, {locker.Write()}} {
			l, err := c.Acquire(ctx, "job", opts...)
			if err != nil {
				t.Fatalf("fair %v: %v", fair, err)
			}
			if err := l.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				// A second writer waits (in fair mode's queue) and gives up.
				wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err := c.Acquire(wctx, "job", locker.Write())
				cancel()
				if !errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, locker.ErrPermission) {
					t.Fatalf("fair %v: a second writer: %v", fair, err)
				}
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An operator's calls: Inspect, ForceRelease and Resize need nothing
	// more, List +scan.
	user, pw := s.user(t, ACL(ns, false)+" "+SharedACL(ns)+" +scan")
	ops, err := s.client(ctx, user, pw, ns, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	if err := ops.Resize(ctx, "job", 1); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	for _, obj := range []locker.LockOption{locker.Semaphore(2), locker.Write()} {
		l, err := ops.Acquire(ctx, "job", obj)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := ops.Inspect(ctx, "job", obj); err != nil || len(st.Holders) != 1 {
			t.Errorf("Inspect = %+v, %v", st, err)
		}
		if all, err := ops.List(ctx, "", obj); err != nil || len(all) != 1 {
			t.Errorf("List = %+v, %v", all, err)
		}
		if _, err := ops.ForceRelease(ctx, "job", l.Fence(), obj); err != nil {
			t.Errorf("ForceRelease: %v", err)
		}
	}
	if err := ops.Resize(ctx, "job", 0); err != nil {
		t.Fatalf("Resize 0: %v", err)
	}
	// A permit's acquire script reads the resize record.
	rec := "~{" + backend.EscapeKey(ns+"/") + "*}:sem.limit"
	user, pw = s.user(t, strings.Replace(ACL(ns, false)+" "+SharedACL(ns), " "+rec+" ", " ", 1))
	c1, err := s.client(ctx, user, pw, ns, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if _, err := c1.TryAcquire(ctx, "job", locker.Semaphore(2)); !errors.Is(err, locker.ErrPermission) {
		t.Fatalf("a permit without %s: %v, want ErrPermission", rec, err)
	}
	user, pw = s.user(t, ACL(ns, false))
	c2, err := s.client(ctx, user, pw, ns, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.TryAcquire(ctx, "job", locker.Semaphore(2)); !errors.Is(err, locker.ErrPermission) {
		t.Fatalf("a permit without SharedACL: %v, want ErrPermission", err)
	}
}

// TestSharedRefreshMany: the batch path takes every mode, each claim
// judged as Refresh would.
func TestSharedRefreshMany(t *testing.T) {
	d, admin := modalDriver(t)
	ctx := testCtx(t)
	key := uniqueKey(t)
	held := []backend.Claim{
		{Key: key, Token: newToken(), TTL: time.Minute},
		{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 2},
		{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Read},
	}
	for _, c := range held {
		if _, err := d.TryAcquire(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	forged := held[1]
	forged.Token = newToken()
	batch := append([]backend.Claim{forged}, held...)
	for i := range batch {
		batch[i].TTL = 2 * time.Minute
	}
	errs := d.RefreshMany(ctx, batch)
	if !errors.Is(errs[0], backend.ErrNotHeld) {
		t.Errorf("forged permit: %v", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("%s: %v", held[i].Mode, err)
		}
	}
	// Extended on the server: the read's expiry is now about 2 minutes off.
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	exp, err := admin.ZScore(ctx, sharedKeys(held[2])[0], held[2].Token).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Duration(exp)*time.Millisecond - time.Duration(now.UnixMilli())*time.Millisecond; left < time.Minute+50*time.Second {
		t.Errorf("the read has %v left after a refresh to 2m", left)
	}
}

// BenchmarkSharedUncontended compares an acquire+release of a lock, a
// permit and a read (the issue asks a permit at most 1.3x a lock).
func BenchmarkSharedUncontended(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	d, err := Open(context.Background(), "redis://"+testenv.RedisAddr()+"/0")
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for _, m := range []backend.Mode{backend.Exclusive, backend.Permit, backend.Read, backend.Write} {
		b.Run(m.String(), func(b *testing.B) {
			ctx := context.Background()
			// An owner as the locker Client's default label is.
			c := backend.Claim{Key: backend.Key("redislock-bench", randHex(6)), TTL: time.Minute, Mode: m, Owner: "host-1.example:12345"}
			if m == backend.Permit {
				c.Limit = 4
			}
			for b.Loop() {
				c.Token = newToken()
				if _, err := d.TryAcquire(ctx, c); err != nil {
					b.Fatal(err)
				}
				if err := d.Release(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFairRWOrder: in fair mode a reader that comes after a waiting writer
// waits behind it, and the writer gets in first once the reader ahead
// leaves.
func TestFairRWOrder(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := testCtx(t)
	newClient := func() *locker.Client {
		d, err := OpenFair(ctx, "redis://"+testenv.RedisAddr()+"/0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1, c2, c3 := newClient(), newClient(), newClient()
	name := "rw-" + randHex(4)
	r1, err := c1.Acquire(ctx, name, locker.Read())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 2)
	var ls [2]*locker.Lock
	go func() {
		l, err := c2.Acquire(ctx, name, locker.Write())
		if err != nil {
			t.Error(err)
		}
		ls[0] = l
		got <- "writer"
	}()
	queued(t, name, 1) // the writer queues first
	if l, err := c3.TryAcquire(ctx, name, locker.Read()); !errors.Is(err, locker.ErrNotAcquired) {
		if err == nil {
			l.Release(ctx)
		}
		t.Fatalf("a reader tried while a writer waits: %v", err)
	}
	go func() {
		l, err := c3.Acquire(ctx, name, locker.Read())
		if err != nil {
			t.Error(err)
		}
		ls[1] = l
		got <- "reader"
	}()
	queued(t, name, 2)
	select {
	case who := <-got:
		t.Fatalf("the %s got in while a reader held", who)
	default:
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var first string
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no one got in after the release")
	}
	if first != "writer" {
		t.Fatalf("the %s got in first", first)
	}
	select {
	case who := <-got:
		t.Fatalf("the %s got in while the writer held", who)
	case <-time.After(200 * time.Millisecond):
	}
	if err := ls[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not get in after the writer")
	}
	if err := ls[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// queued waits, for at most 10s, until the read-write lock name (in the
// default namespace) has n waiters queued.
func queued(t *testing.T, name string, n int64) {
	t.Helper()
	admin := adminClient(t, testenv.RedisAddr())
	q := fairSharedKeys(backend.Claim{Key: backend.Key("locker", name), Mode: backend.Read})[3]
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := admin.ZCard(context.Background(), q).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters queued, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSharedOwners: a grant's owner is a field of its own beside the
// grant's value, which keeps the format earlier versions write and read
// ("<attempt>:<fence>:<permits>"), so that both read each other's holders
// during a rolling upgrade; a holder an earlier version wrote, without an
// owner, reads as one with none. Release, Break and an expiry take the
// owner's field with the grant.
func TestSharedOwners(t *testing.T) {
	d, admin := modalDriver(t)
	t.Parallel()
	ctx := testCtx(t)
	key := uniqueKey(t)
	// c, without an owner, keeps the holders' hash from going with the
	// others, so that what they leave in it shows.
	c := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 4}
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatal(err)
	}
	a := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 4, Weight: 2, Owner: "host:1: a"}
	ga, err := d.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	ks := sharedKeys(a)
	z, h := ks[0], ks[1]
	if v, err := admin.HGet(ctx, h, a.Token).Result(); err != nil || !regexp.MustCompile(`^\d+:\d+:2$`).MatchString(v) {
		t.Errorf("the grant's value = %q, %v; want the format earlier versions read", v, err)
	}
	// An earlier version's holder: its value, no owner.
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	old := newToken()
	if err := admin.ZAdd(ctx, z, redis.Z{Score: float64(now.UnixMilli() + 60000), Member: old}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.HSet(ctx, h, old, fmt.Sprintf("1:%d", ga.Fence+1)).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := d.Inspect(ctx, key, backend.Permit)
	if err != nil {
		t.Fatal(err)
	}
	want := []backend.Holder{{Mode: backend.Permit, Owner: a.Owner, Fence: ga.Fence, Weight: 2}, {Mode: backend.Permit, Fence: ga.Fence + 1, Weight: 1}}
	for i := range st.Holders {
		st.Holders[i].TTL = 0
	}
	slices.SortFunc(st.Holders, func(a, b backend.Holder) int { return cmp.Compare(a.Fence, b.Fence) })
	if !st.Known.Has(backend.KnowsOwner) || len(st.Holders) != 3 || !slices.Equal(st.Holders[1:], want) {
		t.Errorf("Inspect = %+v, want the holders %+v", st, want)
	}
	if _, err := d.Break(ctx, key, backend.Permit, ga.Fence+1); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	noOwners := func(when string) {
		t.Helper()
		if fs, err := admin.HKeys(ctx, h).Result(); err != nil || !slices.Contains(fs, c.Token) || slices.ContainsFunc(fs, func(f string) bool { return strings.HasPrefix(f, "#o") }) {
			t.Errorf("the holders' hash %s: %q, %v; want c's field and no owner's", when, fs, err)
		}
	}
	noOwners("after a Break and a release")
	// An expired holder's owner goes when the next script prunes it.
	b := backend.Claim{Key: key, Token: newToken(), TTL: 50 * time.Millisecond, Mode: backend.Permit, Limit: 4, Owner: "b"}
	if _, err := d.TryAcquire(ctx, b); err != nil {
		t.Fatal(err)
	}
	if o, err := admin.HGet(ctx, h, "#o"+b.Token).Result(); err != nil || o != b.Owner {
		t.Errorf("b's owner field = %q, %v", o, err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := d.Refresh(ctx, c); err != nil {
		t.Fatal(err)
	}
	noOwners("after b expired")
	if err := d.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
}
