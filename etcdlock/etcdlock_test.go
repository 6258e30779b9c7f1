package etcdlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// client returns a locker.Client on a new driver of h, closed at cleanup.
func (h *harness) client(t *testing.T, opts ...locker.Option) (*locker.Client, *Driver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drv, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	c, err := locker.New(drv, append([]locker.Option{locker.WithNamespace("t"), locker.WithDefaultTTL(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, drv.(*Driver)
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestConfigFromURL(t *testing.T) {
	t.Setenv(PasswordEnv, "from-env")
	cases := []struct {
		url       string
		endpoints string
		prefix    string
		user, pw  string
		tls       bool
	}{
		{"etcd://127.0.0.1:2379", "127.0.0.1:2379", DefaultPrefix, "", "", false},
		{"etcd://h1:2379,h2,h3:2380/locks/", "h1:2379,h2:2379,h3:2380", "/locks", "", "", false},
		{"etcd://[::1]/a/b", "[::1]:2379", "/a/b", "", "", false},
		{"etcd://alice:s3cret@h:2379/p", "h:2379", "/p", "alice", "s3cret", false},
		{"etcd://alice@h:2379/p", "h:2379", "/p", "alice", "from-env", false},
		{"etcd://h?tls=true&server_name=etcd.local&dial_timeout=1s", "h:2379", DefaultPrefix, "", "", true},
	}
	for _, c := range cases {
		cfg, prefix, err := ClientConfig(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if got := strings.Join(cfg.Endpoints, ","); got != c.endpoints {
			t.Errorf("%s: endpoints %s, want %s", c.url, got, c.endpoints)
		}
		if prefix != c.prefix {
			t.Errorf("%s: prefix %q, want %q", c.url, prefix, c.prefix)
		}
		if cfg.Username != c.user || cfg.Password != c.pw {
			t.Errorf("%s: user %q password %q, want %q %q", c.url, cfg.Username, cfg.Password, c.user, c.pw)
		}
		if (cfg.TLS != nil) != c.tls {
			t.Errorf("%s: TLS %v, want %v", c.url, cfg.TLS != nil, c.tls)
		}
	}
	// Keep-alive: on by default; keepalive_time=0 turns it off.
	for _, c := range []struct {
		url           string
		time, timeout time.Duration
	}{
		{"etcd://h", defaultKeepAliveTime, defaultKeepAliveTimeout},
		{"etcd://h?keepalive_time=30s&keepalive_timeout=2s", 30 * time.Second, 2 * time.Second},
		{"etcd://h?keepalive_time=0", 0, defaultKeepAliveTimeout},
	} {
		cfg, _, err := ClientConfig(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if cfg.DialKeepAliveTime != c.time || cfg.DialKeepAliveTimeout != c.timeout || cfg.PermitWithoutStream {
			t.Errorf("%s: keep-alive %v/%v (without streams %v), want %v/%v", c.url,
				cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout, cfg.PermitWithoutStream, c.time, c.timeout)
		}
	}
	for _, bad := range []string{
		"etcd://h:2379/p?nope=1",
		"etcd://alice:s3cret@h:2379/p?tls=maybe",
		"etcd://h:2379/p?dial_timeout=soon",
		"etcd://h:2379/p?keepalive_time=5s",
		"etcd://h:2379/p?keepalive_time=-1s",
		"etcd://h:2379/p?keepalive_timeout=0",
		"etcd://h:2379/p?cert=/tmp/x.pem",
		"etcd://h:2379/p?ca=/nonexistent/ca.pem",
		"etcd:///p",
		"etcd://h1,,h2:2379/p",
		"etcd://h1:2379,/p",
		"redis://h:2379/p",
	} {
		_, _, err := ClientConfig(bad)
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s: %v, want ErrInvalidURL", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", bad, err)
		}
	}
}

func TestOpenFailsFast(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := locker.Open(context.Background(), "etcd://alice:s3cret@127.0.0.1:1/x?dial_timeout=500ms")
	if err == nil {
		t.Fatal("Open of an unreachable cluster succeeded")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Open took %v to fail", took)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the password: %v", err)
	}
}

func TestOpenThroughLocker(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c, err := locker.Open(ctx, h.url()+"&namespace=viaopen&ttl=3s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 3*time.Second || l.Fence() == 0 {
		t.Errorf("TTL %v fence %d, want 3s and a fence", l.TTL(), l.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEffectiveTTL: lease TTLs are whole seconds, at least the server's
// minimum, and the Grant says so; locks with one TTL share one lease.
func TestEffectiveTTL(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	_, d := h.client(t)
	for i, c := range []struct{ ask, want time.Duration }{
		{time.Nanosecond, 2 * time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
		{2 * time.Second, 2 * time.Second},
		{2001 * time.Millisecond, 3 * time.Second},
		{10 * time.Second, 10 * time.Second},
	} {
		l := backend.Claim{Key: "t/ttl" + string(rune('a'+i)), Token: strings.Repeat("ab", 16), TTL: c.ask}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatalf("TTL %v: %v", c.ask, err)
		}
		if g.TTL != c.want {
			t.Errorf("TTL %v granted as %v, want %v", c.ask, g.TTL, c.want)
		}
		l.Fence = g.Fence
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	d.mu.Lock()
	n := len(d.leases)
	d.mu.Unlock()
	if n != 3 {
		t.Errorf("%d leases for TTLs of 2s, 3s and 10s, want 3", n)
	}
	if got := d.SessionTTL(); got != 2*time.Second {
		t.Errorf("SessionTTL %v, want 2s", got)
	}
	for _, bad := range []time.Duration{0, -1, (maxLeaseTTL + 1) * time.Second} {
		_, err := d.TryAcquire(ctx, backend.Claim{Key: "t/bad", Token: strings.Repeat("cd", 16), TTL: bad})
		if !errors.Is(err, backend.ErrInvalidTTL) {
			t.Errorf("TTL %v: %v, want ErrInvalidTTL", bad, err)
		}
	}
}

// TestNamesIsolated: the queues of "a" and "a/b" never mix.
func TestNamesIsolated(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, _ := h.client(t)
	c2, _ := h.client(t)
	names := []string{"a", "a/b", "a/", "a%2Fb"}
	var held []*locker.Lock
	for _, n := range names {
		l, err := c1.TryAcquire(ctx, n)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", n, err)
		}
		held = append(held, l)
	}
	got := make(chan string, len(names))
	for _, n := range names {
		go func() {
			l, err := c2.Acquire(ctx, n)
			if err != nil {
				t.Errorf("Acquire(%q): %v", n, err)
				got <- ""
				return
			}
			got <- n
			l.Release(ctx)
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var total int
		for _, n := range names {
			k, err := h.Entries(ctx, backend.Key("t", n))
			if err != nil {
				t.Fatal(err)
			}
			total += k
		}
		if total == 2*len(names) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries, want %d", total, 2*len(names))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, n := range names {
		if err := held[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case w := <-got:
			if w != n {
				t.Fatalf("releasing %q woke the waiter of %q", n, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the waiter of %q did not get it", n)
		}
	}
}

// TestRevokedLease: a lease revoked from outside fires the holder's lost
// signal, and the next waiter gets the lock with a higher fence.
func TestRevokedLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, _ := h.client(t)
	c2, _ := h.client(t)
	l, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	other, err := c1.TryAcquire(ctx, "y") // same client, same lease
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		w, err := c2.Acquire(ctx, "x")
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	time.Sleep(200 * time.Millisecond)
	revoked := time.Now()
	if err := h.Expire(ctx, backend.Key("t", "x")); err != nil {
		t.Fatal(err)
	}
	var w *locker.Lock
	select {
	case w = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock after the holder's lease was revoked")
	}
	if w == nil {
		t.FailNow()
	}
	if w.Fence() <= l.Fence() {
		t.Errorf("fence %d after %d", w.Fence(), l.Fence())
	}
	for _, held := range []*locker.Lock{l, other} {
		select {
		case <-held.Lost():
			if !errors.Is(held.Err(), locker.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", held.Err())
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%q: no lost signal %v after its lease was revoked", held.Name(), time.Since(revoked))
		}
	}
	t.Logf("lost signal %v after the revoke", time.Since(revoked))
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The client goes on with a new lease.
	l2, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatalf("TryAcquire after the lease was lost: %v", err)
	}
	l2.Release(ctx)
}

// TestWaiterLeaseRevoked: a waiter whose lease is revoked queues again with
// a new lease, and still gets the lock.
func TestWaiterLeaseRevoked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, _ := h.client(t)
	c2, d2 := h.client(t)
	l, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := c2.Acquire(ctx, "x")
		if err == nil {
			w.Release(ctx)
		}
		got <- err
	}()
	var id clientv3.LeaseID
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := h.Entries(ctx, backend.Key("t", "x")); n == 2 {
			d2.mu.Lock()
			for _, ls := range d2.leases {
				id = ls.id
			}
			d2.mu.Unlock()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := h.admin.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The waiter learns of it from its next keep-alive (TTL/3), and queues
	// again.
	for deadline := time.Now().Add(3 * time.Second); ; {
		d2.mu.Lock()
		var nu clientv3.LeaseID
		for _, ls := range d2.leases {
			nu = ls.id
		}
		d2.mu.Unlock()
		n, _ := h.Entries(ctx, backend.Key("t", "x"))
		if n == 2 && nu != id && nu != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries 3s after the waiter's lease was revoked, want 2: it queues again", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.Release(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock")
	}
}

// TestEntryDeletedByHand: an entry deleted while its lease lives is
// reported lost within a TTL.
func TestEntryDeletedByHand(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	c1, _ := h.client(t)
	l, err := c1.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.Delete(ctx, h.probe.Dir(backend.Key("t", "x")), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(l.TTL() + time.Second):
		t.Fatal("no lost signal after the entry was deleted")
	}
	if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release = %v, want ErrNotHeld", err)
	}
}

// TestNewKeepsUserClient: Close frees the locks but leaves the user's client
// open.
func TestNewKeepsUserClient(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	d, err := New(h.admin, WithPrefix(h.prefix))
	if err != nil {
		t.Fatal(err)
	}
	l := backend.Claim{Key: "t/x", Token: strings.Repeat("ef", 16), TTL: 2 * time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Entries(ctx, "t/x"); err != nil || n != 0 {
		t.Fatalf("%d entries after Close (err %v), want 0", n, err)
	}
	if _, err := d.TryAcquire(ctx, l); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if err := d.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
}

// TestMemberStopped: with a member of the cluster stopped (first etcd-1,
// then whichever member leads), locks keep working through the others, no
// two holders ever hold at once, fences keep increasing, and a lock held
// across the stop is not lost. The cluster is the test's own: the shared
// one (etcd-c1..c3) serves other tests and other runs meanwhile.
func TestMemberStopped(t *testing.T) {
	members := testenv.StartEtcdCluster(t, 3)
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.Addr)
	}
	h := newHarness(t, endpoints)
	memberStopped(t, h, members[0])
	leader := members[leaderIndex(t, h)]
	t.Logf("the leader is %s", leader.Name)
	memberStopped(t, h, leader)
}

// waitHealthy waits until every member of the cluster answers and all
// agree on one leader, so that a member restarted by the last step is back
// in the cluster before the next step stops another.
func waitHealthy(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		leaders := map[uint64]bool{}
		var err error
		for _, ep := range h.endpoints {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, e := h.admin.Status(ctx, ep)
			cancel()
			if e != nil {
				err = e
				break
			}
			leaders[st.Leader] = true
		}
		if err == nil && len(leaders) == 1 && !leaders[0] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster is not healthy 30 s after a restart: leaders %v, %v", leaders, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaderIndex is the index in h.endpoints of the cluster's leader.
func leaderIndex(t *testing.T, h *harness) int {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	var leader uint64
	ids := map[uint64]int{}
	for i, ep := range h.endpoints {
		st, err := h.admin.Status(ctx, ep)
		if err != nil {
			t.Fatalf("status of %s: %v", ep, err)
		}
		leader = st.Leader
		ids[st.Header.MemberId] = i
	}
	i, ok := ids[leader]
	if !ok {
		t.Fatalf("leader %x is none of %v", leader, h.endpoints)
	}
	return i
}

func memberStopped(t *testing.T, h *harness, m *testenv.Server) {
	instance := m.Name
	ctx := testCtx(t, 2*time.Minute)
	c1, _ := h.client(t)
	c2, _ := h.client(t)
	long, err := c1.TryAcquire(ctx, "long-"+instance, locker.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		inside     int
		lastFence  uint64
		acquired   atomic.Int64
		errCount   atomic.Int64
		stopped    atomic.Bool
		afterStop  atomic.Int64
		stopWorker = make(chan struct{})
		wg         sync.WaitGroup
	)
	for w := range 6 {
		c := []*locker.Client{c1, c2}[w%2]
		wg.Go(func() {
			for {
				select {
				case <-stopWorker:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				l, err := c.Acquire(actx, "x-"+instance)
				cancel()
				if err != nil {
					errCount.Add(1)
					t.Logf("worker %d: %v", w, err)
					time.Sleep(50 * time.Millisecond)
					continue
				}
				mu.Lock()
				inside++
				if inside != 1 {
					t.Errorf("%d holders at once", inside)
				}
				if l.Fence() <= lastFence {
					t.Errorf("fence %d after %d", l.Fence(), lastFence)
				}
				lastFence = l.Fence()
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				acquired.Add(1)
				if stopped.Load() {
					afterStop.Add(1)
				}
				if err := l.Release(ctx); err != nil {
					t.Logf("worker %d: release: %v", w, err)
				}
			}
		})
	}
	time.Sleep(time.Second)
	before := acquired.Load()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped.Store(true)
	stoppedAt := time.Now()
	// The member stays down for at least 4 s, and until 20 acquisitions
	// went through without it (a new leader must be elected first, which
	// on a loaded machine can take seconds), or 30 s, a generous bound.
	var firstAfter time.Duration
	for time.Since(stoppedAt) < 30*time.Second {
		n := afterStop.Load()
		if n > 0 && firstAfter == 0 {
			firstAfter = time.Since(stoppedAt)
		}
		if n >= 20 && time.Since(stoppedAt) >= 4*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	during := afterStop.Load()
	down := time.Since(stoppedAt)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, h)
	close(stopWorker)
	wg.Wait()
	t.Logf("%s: acquisitions: %d before the stop, %d in the %v it was down (the first after %v), %d in all; %d errors",
		instance, before, during, down.Round(time.Millisecond), firstAfter.Round(time.Millisecond), acquired.Load(), errCount.Load())
	if before == 0 || during < 20 {
		t.Fatalf("locks did not keep working: %d acquisitions before the stop, %d in the %v %s was down", before, during, down.Round(time.Millisecond), instance)
	}
	select {
	case <-long.Lost():
		t.Errorf("a lock held across the stop of %s was lost: %v", instance, long.Err())
	default:
	}
	if err := long.Release(ctx); err != nil {
		t.Errorf("release of the long-held lock: %v", err)
	}
}

// TestOrphanSweep: an entry whose deletion failed is deleted by the
// background sweep, and its slot is then reused.
func TestOrphanSweep(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	_, d := h.client(t)
	l := backend.Claim{Key: "t/orphan", Token: strings.Repeat("12", 16), TTL: 2 * time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	// As if the release's request had failed.
	d.mu.Lock()
	e := d.held[holdKeyOf(l)]
	d.mu.Unlock()
	d.forget(e)
	d.mu.Lock()
	d.orphans[e.s] = e.rev
	d.mu.Unlock()
	for deadline := time.Now().Add(3 * time.Second); ; {
		n, err := h.Entries(ctx, l.Key)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphaned entry is still there 3s later")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The sweep forgets the entry once its delete returned: wait for that
	// (bounded) rather than for a set time a loaded machine may not run
	// the sweep's goroutine in.
	var left, slots int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d.mu.Lock()
		left, slots = len(d.orphans), len(e.s.ls.slots)
		d.mu.Unlock()
		if left == 0 && slots == 0 || time.Now().After(deadline) {
			break
		}
	}
	if left != 0 || slots != 0 {
		t.Fatalf("%d orphans and %d slot directories left 5s after the sweep deleted the entry", left, slots)
	}
	l.Token = strings.Repeat("34", 16)
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	l.Fence = g.Fence
	d.mu.Lock()
	key := d.held[holdKeyOf(l)].s.key
	d.mu.Unlock()
	if key != e.s.key {
		t.Errorf("new entry %s, want the freed slot's %s", key, e.s.key)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestRefreshRightAfterAcquire: on a cluster, a refresh that follows an
// acquisition at once, through another member, still finds the lock (etcd
// serves a transaction without operations as a serializable read, from a
// member that may not have applied the acquisition yet).
func TestRefreshRightAfterAcquire(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdClusterEndpoints())
	ctx := testCtx(t, time.Minute)
	c, _ := h.client(t)
	for i := range 200 {
		l, err := c.TryAcquire(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Refresh(ctx); err != nil {
			t.Fatalf("round %d: refresh right after the acquisition: %v", i, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A lock lives on its session lease, which the driver keeps alive: with no
// refresh from the Client it stays held, and not reported lost, for as long
// as the keep-alives get through (Grant.Contact), like a ZooKeeper lock.
func TestSessionKeepsUnrefreshedLock(t *testing.T) {
	h := newHarness(t, testenv.EtcdEndpoints())
	c, _ := h.client(t)
	other, _ := h.client(t)
	ctx := testCtx(t, 30*time.Second)
	l, err := c.TryAcquire(ctx, "session-"+t.Name(), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	select {
	case <-l.Lost():
		t.Fatalf("lost while its lease was kept alive: %v", l.Err())
	case <-time.After(3 * l.TTL()):
	}
	if _, err := other.TryAcquire(ctx, "session-"+t.Name()); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("another client's TryAcquire = %v, want ErrNotAcquired", err)
	}
}

// A URL that names a user for whom no password is found is refused before
// any connection: etcd would otherwise run the client as its certificate's
// identity, or unauthenticated.
func TestUserWithoutPasswordIsRefused(t *testing.T) {
	t.Setenv(PasswordEnv, "")
	certs := testenv.NewCerts(t)
	for _, raw := range []string{"etcd://alice@h:2379/p", "etcd://alice:@h:2379/p",
		"etcd://alice@h?ca=" + certs.CA + "&cert=" + certs.ClientCert + "&key=" + certs.ClientKey} {
		_, _, err := ClientConfig(raw)
		if !errors.Is(err, backend.ErrInvalidURL) || !strings.Contains(err.Error(), "no password for user") {
			t.Errorf("%s: %v, want ErrInvalidURL naming the missing password", raw, err)
		}
	}
}

// The server's refusals of the credentials or of an operation are
// ErrPermission, which the Client does not retry; other errors are not.
func TestPermissionErrors(t *testing.T) {
	for _, err := range []error{rpctypes.ErrGRPCPermissionDenied, rpctypes.ErrGRPCAuthFailed, rpctypes.ErrGRPCInvalidAuthToken} {
		if !errors.Is(permission(err), backend.ErrPermission) {
			t.Errorf("%v is not ErrPermission", err)
		}
	}
	for _, err := range []error{rpctypes.ErrGRPCNoLeader, context.DeadlineExceeded, errors.New("x")} {
		if errors.Is(permission(err), backend.ErrPermission) {
			t.Errorf("%v is ErrPermission", err)
		}
	}
}

// mustNew is New on a client the test made.
func mustNew(t testing.TB, cli *clientv3.Client, opts ...Option) *Driver {
	t.Helper()
	d, err := New(cli, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

// New refuses a nil client before any network call; WithPrefix given to
// Open overrides the URL's path.
func TestConstructorOptions(t *testing.T) {
	if d, err := New(nil); !errors.Is(err, backend.ErrInvalidOption) || d != nil {
		t.Errorf("New(nil) = %v, %v; want ErrInvalidOption", d, err)
	}
	if _, err := Open(context.Background(), "redis://127.0.0.1:1"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("Open(redis://) = %v, want ErrInvalidURL", err)
	}
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	d, err := Open(ctx, h.url(), WithPrefix(h.prefix+"/sub/"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got, want := d.Prefix(), h.prefix+"/sub"; got != want {
		t.Errorf("Prefix() = %q, want %q", got, want)
	}
}

// TestCutOffFailureBudget: cut off from etcd, a waiter returns the store's
// error once every request has failed for the failure budget, and so does
// a try-acquire (not after a number of tries, nor when ctx ends); once
// etcd is back, the waiter's entry is gone without anyone's help.
func TestCutOffFailureBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, time.Minute)
	_, holder := h.client(t)
	drv, down, err := h.NewCutDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := drv.(*Driver)
	c, err := locker.New(d, locker.WithNamespace("t"), locker.WithDefaultTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down(false); c.Close() })
	held := backend.Claim{Key: backend.Key("t", "cut"), Token: strings.Repeat("12", 16), TTL: 2 * time.Second}
	if _, err := holder.TryAcquire(ctx, held); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "cut")
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, err := h.Entries(ctx, held.Key); err != nil || n == 2 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the waiter had not queued 5s later (%d entries)", n)
		}
	}
	budget := backend.StoreFailureBudget
	// Given up one attempt (cut up to cutTick past attemptTimeout), one
	// pause and a busy machine's second after the budget at most.
	late := budget + attemptTimeout + cutTick + 1500*time.Millisecond
	checkErr := func(what string, err error, took time.Duration, early time.Duration) {
		t.Helper()
		switch {
		case err == nil:
			t.Fatalf("%s succeeded through a dead connection", what)
		case errors.Is(err, backend.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
			t.Fatalf("%s = %v, want the store's error", what, err)
		case took < early || took > late:
			t.Fatalf("%s gave up after %v, want between %v and %v", what, took, early, late)
		}
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
	}
	down(true)
	cut := time.Now()
	select {
	case err := <-done:
		// The first failed request may have been sent just before the cut.
		checkErr("Acquire", err, time.Since(cut), budget-250*time.Millisecond)
	case <-time.After(late + time.Second):
		t.Fatalf("the waiter's Acquire had not returned %v into the outage", late+time.Second)
	}
	start := time.Now()
	_, err = d.TryAcquire(ctx, backend.Claim{Key: "t/cut-try", Token: strings.Repeat("56", 16), TTL: 2 * time.Second})
	checkErr("TryAcquire", err, time.Since(start), budget)

	down(false)
	// The entry goes by the sweep after the next keep-alive, or with its
	// lease: within a lease TTL and a keep-alive's reconnection.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := h.Entries(ctx, held.Key)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries of the name 10s after etcd came back, want the holder's alone", n)
		}
	}
	if err := holder.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
}
