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
// after waiting (its marker put after the waiter behind it queued), keeps
// the name from that waiter until the delay after its session's end (its
// entry's deletion), and Inspect shows it held meanwhile.
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

	dir := h.probe.Dir(backend.Key("t", name))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := make(chan time.Time, 1)
	wch := h.admin.Watch(clientv3.WithRequireLeader(wctx), dir, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	<-wch // created
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.PrevKv != nil && ev.PrevKv.CreateRevision == int64(st0.Fence) && !isMark(ev.Kv.Key) {
					gone <- time.Now()
					return
				}
			}
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
		t.Fatalf("the waiter got the lock (fence %d) %v after the kill, before the killed holder's entry was gone", l.Fence(), time.Since(killed))
	case <-time.After(10 * time.Second):
		t.Fatal("the killed holder's entry outlived its session")
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
	// The marker's lease ends markPad after the delay, and etcd revokes
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
// once, of a live holder or a lost one (which Inspect shows meanwhile);
// modes other than the lock refuse a delay before any request.
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

	if l, err = a.TryAcquire(ctx, "x", locker.LockDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ForceRelease(ctx, "x", l.Fence()); err != nil {
		t.Fatalf("ForceRelease of a live holder: %v", err)
	}
	free("ForceRelease of a live holder")

	// Acquire on a free name puts the marker in its one transaction.
	if l, err = a.Acquire(ctx, "x", locker.LockDelay(time.Hour), locker.Label("lost")); err != nil {
		t.Fatal(err)
	}
	dir := h.probe.Dir(backend.Key("t", "x"))
	if m, err := h.admin.Get(ctx, dir+"~", clientv3.WithPrefix()); err != nil || len(m.Kvs) != 1 || m.Kvs[0].CreateRevision != int64(l.Fence()) {
		t.Fatalf("markers of a lock acquired under fence %d on a free name: %v, %v; want one, put with the entry", l.Fence(), m, err)
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

	c, _ := h.client(t)
	if _, err = c.TryAcquire(ctx, "x", locker.LockDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	free("Close")

	for i, mode := range []locker.LockOption{locker.Semaphore(2), locker.Read(), locker.Write()} {
		if _, err := a.TryAcquire(ctx, "y", mode, locker.LockDelay(time.Second)); !errors.Is(err, locker.ErrUnsupported) {
			t.Errorf("TryAcquire in mode %d (semaphore, reader, writer) with LockDelay = %v, want ErrUnsupported", i, err)
		}
	}
}

const noMarksEnv = "ETCDLOCK_NO_MARKS" // runs TestNoMarksChild

// TestLockDelayNeedsMarkers: the conformance case fails a driver that
// keeps no marker (it drops each claim's delay) while claiming to.
func TestLockDelayNeedsMarkers(t *testing.T) {
	t.Parallel()
	testenv.Require(t, testenv.EtcdEndpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestNoMarksChild$/^Parallel$/^LockDelayAfterLoss$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), noMarksEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !regexp.MustCompile(`--- FAIL: TestNoMarksChild/Parallel/LockDelayAfterLoss `).Match(out) {
		t.Fatalf("LockDelayAfterLoss did not fail a driver without markers: %v\n%s", err, out)
	}
}

func TestNoMarksChild(t *testing.T) {
	if os.Getenv(noMarksEnv) == "" {
		t.Skip("the child of TestLockDelayNeedsMarkers")
	}
	conformance.Run(t, noMarksHarness{newHarness(t, testenv.EtcdEndpoints())})
}

type noMarksHarness struct{ *harness }

func (h noMarksHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	d, err := h.harness.NewDriver(ctx)
	if err != nil {
		return nil, err
	}
	return noMarks{d.(*Driver)}, nil
}

// noMarks is the driver, broken: it says it keeps delays, and drops them.
type noMarks struct{ *Driver }

func (d noMarks) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	c.Delay = 0
	return d.Driver.TryAcquire(ctx, c)
}

func (d noMarks) Enqueue(ctx context.Context, c backend.Claim) (backend.Grant, backend.Ticket, error) {
	c.Delay = 0
	return d.Driver.Enqueue(ctx, c)
}
