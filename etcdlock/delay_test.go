package etcdlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const delayChildEnv = "ETCDLOCK_DELAY_CHILD" // the URL, for the child holder

// TestLockDelayAfterKill: a holder killed with -9, granted with a delay
// after waiting (its entry moved to its mark lease then), keeps the name
// from the waiter behind it until the delay after its session's end, and
// Inspect shows it held meanwhile.
func TestLockDelayAfterKill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, time.Minute)
	a, _ := h.client(t)
	b, _ := h.client(t)
	const name, delay = "killed", 3 * time.Second
	first, err := a.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDelayChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), delayChildEnv+"="+h.url())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waiters(t, ctx, b, name, 1)
	got := make(chan *locker.Lock, 1)
	go func() {
		l, err := b.Acquire(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waiters(t, ctx, b, name, 2)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "held ") {
				held <- sc.Text()
			}
		}
	}()
	select {
	case line := <-held:
		t.Logf("child: %s", line)
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not get the lock after the first holder's release")
	}
	st0, err := b.Inspect(ctx, name)
	if err != nil || !st0.Held || st0.Waiters != 1 {
		t.Fatalf("Inspect with the child holding = %+v, %v", st0, err)
	}

	// The session's end: when the server no longer has the child's
	// session lease, named in its entry's key.
	resp, err := h.admin.Get(ctx, h.probe.Dir(backend.Key("t", name)), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(st0.Fence) {
		t.Fatalf("the child's entry: %v, %v", resp, err)
	}
	session := sessionOf(resp.Kvs[0].Key)
	if clientv3.LeaseID(resp.Kvs[0].Lease) == session {
		t.Fatal("the child's entry is on its session lease, which no delay outlives")
	}
	gone := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			if ttl, err := h.admin.TimeToLive(ctx, session); err == nil && ttl.TTL == -1 {
				gone <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var end time.Time
	select {
	case end = <-gone:
	case l := <-got:
		t.Fatalf("the waiter got the lock (fence %d) %v after the kill, before the killed holder's session ended", l.Fence(), time.Since(killed))
	case <-time.After(10 * time.Second):
		t.Fatal("the killed holder's session outlived its TTL")
	}
	t.Logf("session ended %v after the kill", end.Sub(killed))
	if st, err := b.Inspect(ctx, name); err != nil || !st.Held || st.Fence != st0.Fence || st.Owner != st0.Owner || st.Waiters != 1 {
		t.Errorf("Inspect in the delay = %+v, %v; want held by %q under fence %d, one waiter", st, err, st0.Owner, st0.Fence)
	}
	var l *locker.Lock
	select {
	case l = <-got:
	case <-time.After(delay + markPad + 5*time.Second):
		t.Fatalf("the waiter did not get the lock %v after the session's end (delay %v)", time.Since(end), delay)
	}
	if l == nil {
		t.FailNow()
	}
	took := time.Since(end)
	t.Logf("granted %v after the session's end (delay %v)", took, delay)
	if took < delay {
		t.Errorf("granted %v after the killed holder's session ended, before the delay %v", took, delay)
	}
	// The mark lease ends markPad after the delay, and etcd revokes
	// expired leases every 500ms.
	if bound := delay + markPad + time.Second; took > bound {
		t.Errorf("granted %v after the session's end, want within %v", took, bound)
	}
	if l.Fence() <= st0.Fence {
		t.Errorf("fence %d after the killed holder's %d", l.Fence(), st0.Fence)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// waiters waits until name has n waiters.
func waiters(t *testing.T, ctx context.Context, c *locker.Client, name string, n int) {
	t.Helper()
	for range 200 {
		if st, err := c.Inspect(ctx, name); err == nil && st.Waiters == n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%q never had %d waiters", name, n)
}

// TestDelayChild is the holder of TestLockDelayAfterKill, in a child
// process: it waits for the lock with a delay, says so, and hangs.
func TestDelayChild(t *testing.T) {
	u := os.Getenv(delayChildEnv)
	if u == "" {
		t.Skip("the child of TestLockDelayAfterKill")
	}
	ctx := context.Background()
	c, err := locker.Open(ctx, u, locker.WithNamespace("t"), locker.WithDefaultTTL(2*time.Second), locker.WithLabel("child"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, "killed", locker.LockDelay(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("held %d\n", l.Fence())
	time.Sleep(time.Minute)
}

// TestLockDelayEnds: a release, a Close and a ForceRelease end a delay at
// once, of a live holder or a lost one (which Inspect shows meanwhile),
// a lock's, a permit's or a reader's.
func TestLockDelayEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	a, _ := h.client(t)
	b, _ := h.client(t)
	free := func(why string) {
		t.Helper()
		l, err := b.TryAcquire(ctx, "x")
		if err != nil {
			t.Fatalf("TryAcquire after %s: %v", why, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := a.TryAcquire(ctx, "x", locker.LockDelay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	free("a release")

	// Waited for, the entry moves to its mark lease: still the holder's.
	first, err := b.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(200*time.Millisecond, func() { first.Release(ctx) })
	if l, err = a.Acquire(ctx, "x", locker.LockDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the driver checks its entries every TTL/3
	select {
	case <-l.Lost():
		t.Fatalf("a lock waited for with a delay was lost: %v", l.Err())
	default:
	}
	if err := l.Refresh(ctx); err != nil {
		t.Fatalf("Refresh of a lock waited for with a delay: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	free("the release of a lock waited for")

	if l, err = a.TryAcquire(ctx, "x", locker.LockDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ForceRelease(ctx, "x", l.Fence()); err != nil {
		t.Fatalf("ForceRelease of a live holder: %v", err)
	}
	free("ForceRelease of a live holder")

	// Acquire on a free name puts the entry on its mark lease at once.
	if l, err = a.Acquire(ctx, "x", locker.LockDelay(time.Hour), locker.Label("lost")); err != nil {
		t.Fatal(err)
	}
	r, err := h.admin.Get(ctx, h.probe.Dir(backend.Key("t", "x")), clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].ModRevision != int64(l.Fence()) || clientv3.LeaseID(r.Kvs[0].Lease) == sessionOf(r.Kvs[0].Key) {
		t.Fatalf("the entry of a lock acquired with a delay on a free name, under fence %d: %v, %v; want one, put on a lease other than its session's in one request", l.Fence(), r, err)
	}
	if err := h.Expire(ctx, backend.Key("t", "x")); err != nil {
		t.Fatal(err)
	}
	<-l.Lost()
	if _, err := b.TryAcquire(ctx, "x"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire in the delay = %v, want ErrNotAcquired", err)
	}
	st, err := b.Inspect(ctx, "x")
	if err != nil || !st.Held || st.Owner != "lost" || st.Fence != l.Fence() || st.TTL <= 0 {
		t.Fatalf("Inspect in the delay = %+v, %v; want held by %q under fence %d, with a TTL", st, err, "lost", l.Fence())
	}
	if _, err := b.ForceRelease(ctx, "x", l.Fence()); err != nil {
		t.Fatalf("ForceRelease in the delay: %v", err)
	}
	free("ForceRelease in the delay")

	// So does the ForceRelease of a lost permit or reader, for that
	// holder.
	for _, tc := range []struct {
		name        string
		hold, other locker.LockOption
	}{
		{"xs", locker.Semaphore(1), locker.Semaphore(1)},
		{"xr", locker.Read(), locker.Write()},
	} {
		l, err := a.TryAcquire(ctx, tc.name, tc.hold, locker.LockDelay(time.Hour), locker.Label("lost"))
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Expire(ctx, backend.Key("t", tc.name)); err != nil {
			t.Fatal(err)
		}
		<-l.Lost()
		if _, err := b.TryAcquire(ctx, tc.name, tc.other); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) in the delay = %v, want ErrNotAcquired", tc.name, err)
		}
		st, err := b.Inspect(ctx, tc.name, tc.hold)
		if err != nil || len(st.Holders) != 1 || st.Holders[0].Owner != "lost" || st.Holders[0].Fence != l.Fence() || !st.Known.Has(locker.KnowsTTL) || st.Holders[0].TTL <= 0 {
			t.Fatalf("Inspect(%q) in the delay = %+v, %v; want held by %q under fence %d, with a TTL", tc.name, st, err, "lost", l.Fence())
		}
		if _, err := b.ForceRelease(ctx, tc.name, l.Fence(), tc.hold); err != nil {
			t.Fatalf("ForceRelease(%q) in the delay: %v", tc.name, err)
		}
		n, err := b.TryAcquire(ctx, tc.name, tc.other)
		if err != nil {
			t.Fatalf("TryAcquire(%q) after ForceRelease in the delay: %v", tc.name, err)
		}
		if err := n.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	c, _ := h.client(t)
	if _, err = c.TryAcquire(ctx, "x", locker.LockDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	free("Close")

}

// TestLockDelayModes: a lost permit keeps its place in the semaphore, and
// a lost reader keeps writers out (not readers), for the delay.
func TestLockDelayModes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	a, _ := h.client(t)
	b, _ := h.client(t)
	const delay = 2 * time.Second
	lose := func(name string, l *locker.Lock) time.Time {
		t.Helper()
		at := time.Now()
		if err := h.Expire(ctx, backend.Key("t", name)); err != nil {
			t.Fatal(err)
		}
		<-l.Lost()
		return at
	}
	must := func(l *locker.Lock, err error) *locker.Lock {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	refused := func(name string, opts ...locker.LockOption) {
		t.Helper()
		if _, err := b.TryAcquire(ctx, name, opts...); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) in a delay = %v, want ErrNotAcquired", name, err)
		}
	}
	after := func(lost time.Time, l *locker.Lock) {
		t.Helper()
		if took := time.Since(lost); took < delay {
			t.Errorf("granted %v after the loss, before the delay %v", took, delay)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	sem := locker.Semaphore(2)
	lost := lose("s", must(a.TryAcquire(ctx, "s", sem, locker.LockDelay(delay))))
	other := must(b.TryAcquire(ctx, "s", sem))
	refused("s", sem)
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other = must(b.TryAcquire(ctx, "s", sem)) // the free permit
	after(lost, must(b.Acquire(ctx, "s", sem)))
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}

	lost = lose("r", must(a.TryAcquire(ctx, "r", locker.Read(), locker.LockDelay(delay))))
	if err := must(b.TryAcquire(ctx, "r", locker.Read())).Release(ctx); err != nil {
		t.Fatal(err)
	}
	refused("r", locker.Write())
	after(lost, must(b.Acquire(ctx, "r", locker.Write())))
}

const noDelayEnv = "ETCDLOCK_NO_DELAY" // runs TestNoDelayChild

// TestLockDelayCaught: the conformance case fails a driver that keeps
// no delay (it drops each claim's) while it says it does.
func TestLockDelayCaught(t *testing.T) {
	t.Parallel()
	testenv.Require(t, testenv.EtcdEndpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestNoDelayChild$/^Parallel$/^LockDelayAfterLoss$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), noDelayEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !regexp.MustCompile(`--- FAIL: TestNoDelayChild/Parallel/LockDelayAfterLoss `).Match(out) {
		t.Fatalf("LockDelayAfterLoss did not fail a driver that drops delays: %v\n%s", err, out)
	}
}

func TestNoDelayChild(t *testing.T) {
	if os.Getenv(noDelayEnv) == "" {
		t.Skip("the child of TestLockDelayCaught")
	}
	conformance.Run(t, noDelayHarness{newHarness(t, testenv.EtcdEndpoints())})
}

type noDelayHarness struct{ *harness }

func (h noDelayHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	d, err := h.harness.NewDriver(ctx)
	if err != nil {
		return nil, err
	}
	return noDelay{d.(*Driver)}, nil
}

// noDelay is the driver, broken: it says it keeps delays, and drops them.
type noDelay struct{ *Driver }

func (d noDelay) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	c.Delay = 0
	return d.Driver.TryAcquire(ctx, c)
}

func (d noDelay) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	c.Delay = 0
	return d.Driver.Enqueue(ctx, c)
}
