package redislock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// cancelBound is how soon after its context is cancelled a call blocked on
// a dead connection must return: the contract's 100 ms and a round trip,
// with slack for a loaded machine (as the fault suite's bound).
const cancelBound = 500 * time.Millisecond

func newFaultProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(testenv.RedisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// proxiedDriver opens a Driver, or a FairDriver's, through p.
func proxiedDriver(t *testing.T, p *faultproxy.Proxy, fair bool) *Driver {
	t.Helper()
	url := "redis://" + p.Addr() + "/0"
	var d *Driver
	if fair {
		fd, err := OpenFair(testCtx(t), url)
		if err != nil {
			t.Fatal(err)
		}
		d = fd.Driver
	} else {
		var err error
		if d, err = Open(testCtx(t), url); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// directDriver is a driver of the same mode straight to the server.
func directDriver(t *testing.T, fair bool) *Driver {
	t.Helper()
	d := openDriver(t)
	d.fair = fair
	return d
}

// cancelled runs call, cancels its context after 300 ms, and checks that it
// returns an error within cancelBound. during, if not nil, runs meanwhile,
// 50 ms after the call began.
func cancelled(t *testing.T, what string, call func(ctx context.Context) error, during func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	if during != nil {
		time.Sleep(50 * time.Millisecond)
		during()
	}
	select {
	case err := <-done:
		t.Fatalf("%s returned before its context was cancelled: %v", what, err)
	case <-time.After(300 * time.Millisecond):
	}
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		took := time.Since(t0)
		t.Logf("%s returned %v after cancel: %v", what, took.Round(time.Millisecond), err)
		if took > cancelBound {
			t.Errorf("%s returned %v after cancel, bound %v", what, took.Round(time.Millisecond), cancelBound)
		}
		if err == nil {
			t.Errorf("%s succeeded", what)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s still blocked 15 s after cancel", what)
	}
}

func modeName(fair bool) string {
	if fair {
		return "fair"
	}
	return "plain"
}

// A waiter whose call blocks on a blackholed connection returns soon after
// its context is cancelled: the driver call, and the Client's Acquire
// (whose first try calls the driver directly).
func TestCancelBlackholed(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	for _, fair := range []bool{false, true} {
		t.Run(modeName(fair), func(t *testing.T) {
			ns := "redislock-cancel"
			name := randHex(4)
			key := backend.Key(ns, name)
			holder := directDriver(t, fair)
			hl := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
			if _, err := holder.TryAcquire(testCtx(t), hl); err != nil {
				t.Fatal(err)
			}
			defer holder.Release(context.Background(), hl)

			t.Run("driver", func(t *testing.T) {
				p := newFaultProxy(t)
				d := proxiedDriver(t, p, fair)
				l := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
				// Warm the connection, then cut it off.
				if _, err := d.TryAcquire(testCtx(t), l); !errors.Is(err, backend.ErrNotAcquired) {
					t.Fatalf("TryAcquire of a held lock: %v", err)
				}
				p.Blackhole()
				if fair {
					cancelled(t, "FairDriver.Acquire", func(ctx context.Context) error {
						_, err := queueAcquire(ctx, &FairDriver{d}, l)
						return err
					}, nil)
				} else {
					cancelled(t, "Driver.TryAcquire", func(ctx context.Context) error {
						_, err := d.TryAcquire(ctx, l)
						return err
					}, nil)
				}
			})
			t.Run("client", func(t *testing.T) {
				p := newFaultProxy(t)
				var drv backend.Driver = proxiedDriver(t, p, fair)
				if fair {
					drv = &FairDriver{drv.(*Driver)}
				}
				c, err := locker.New(drv, locker.WithNamespace(ns))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.TryAcquire(testCtx(t), name); !errors.Is(err, locker.ErrNotAcquired) {
					t.Fatalf("TryAcquire of a held lock: %v", err)
				}
				p.Blackhole()
				cancelled(t, "Client.Acquire", func(ctx context.Context) error {
					_, err := c.Acquire(ctx, name)
					return err
				}, nil)
			})
		})
	}
}

// A call whose request reaches the server but whose answer is lost, and
// which is interrupted at its cancel, leaves the lock free: the cleanup
// (plain: the release of its attempt; fair: leave) reaches the server too.
func TestCancelLostAnswerLeavesLockFree(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	for _, fair := range []bool{false, true} {
		t.Run(modeName(fair), func(t *testing.T) {
			admin := adminClient(t, testenv.RedisAddr())
			p := newFaultProxy(t)
			d := proxiedDriver(t, p, fair)
			key := uniqueKey(t)
			other := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
			if _, err := d.TryAcquire(testCtx(t), other); err != nil {
				t.Fatal(err)
			}
			if err := d.Release(testCtx(t), other); err != nil {
				t.Fatal(err)
			}
			// Spare connections, for the cleanup: a new one would wait
			// for the server's greeting in vain. Four held at once are
			// four connections (concurrent PINGs may share one), which
			// go back to the pool idle.
			var spare []*redis.Conn
			for range 4 {
				c := d.dep.rdb.(*redis.Client).Conn()
				if err := c.Ping(testCtx(t)).Err(); err != nil {
					t.Fatal(err)
				}
				spare = append(spare, c)
			}
			for _, c := range spare {
				c.Close()
			}
			// A server that knows the acquisition's script but never ran
			// the clean-up's: its NOSCRIPT answer would be lost, so the
			// clean-up must not depend on it.
			if err := admin.ScriptFlush(testCtx(t)).Err(); err != nil {
				t.Fatal(err)
			}
			for _, s := range []*script{acquireScript, fairAcquireScript} {
				if err := s.Load(testCtx(t), admin).Err(); err != nil {
					t.Fatal(err)
				}
			}
			p.BlackholeDown() // requests arrive, answers do not
			l := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
			granted := func() {
				if v, err := admin.Get(testCtx(t), keysFor(key).lock).Result(); err != nil || !strings.HasPrefix(v, holder(l)) {
					t.Errorf("the server did not grant the lock to the stuck call: %q, %v", v, err)
				}
			}
			if fair {
				cancelled(t, "FairDriver.Acquire", func(ctx context.Context) error {
					_, err := queueAcquire(ctx, &FairDriver{d}, l)
					return err
				}, granted)
			} else {
				cancelled(t, "Driver.TryAcquire", func(ctx context.Context) error {
					_, err := d.TryAcquire(ctx, l)
					return err
				}, granted)
			}
			// The cleanup's answer is lost too: it ran all the same.
			deadline := time.Now().Add(2 * time.Second)
			ks := keysFor(key)
			for {
				n, err := admin.Exists(testCtx(t), ks.lock, ks.queue, ks.live).Result()
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					v, _ := admin.Get(testCtx(t), keysFor(key).lock).Result()
					t.Fatalf("2 s after the cancel, %d of the lock's keys remain (lock value %q, ttl %v)", n, v, admin.PTTL(testCtx(t), keysFor(key).lock).Val())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// routedDriver is a Driver whose client dials *route at each new
// connection, made interruptible as Open makes it; tune, if given, sets
// the client's other options.
func routedDriver(t *testing.T, route *atomic.Pointer[string], tune ...func(*redis.Options)) (*Driver, *conntrack.Tracker) {
	t.Helper()
	o := &redis.Options{
		Addr: "routed:0",
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *route.Load())
		},
	}
	for _, f := range tune {
		f(o)
	}
	in := interruptible(o)
	rdb := redis.NewClient(o)
	cfg, _ := buildConfig(nil)
	d := &Driver{dep: newDeployment(rdb, in, &cfg)}
	t.Cleanup(func() { d.Close() })
	return d, in
}

// Interrupting a call stuck on a dead connection disturbs neither the
// calls of other callers in flight on the same client over healthy
// connections (each of whose reads waits 10 ms for the server's answer),
// nor its pub/sub connection, which reads without a deadline.
func TestCancelSparesHealthyCalls(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	dead, slow := newFaultProxy(t), newFaultProxy(t)
	slow.Delay(0, 10*time.Millisecond)
	var route atomic.Pointer[string]
	deadAddr, slowAddr := dead.Addr(), slow.Addr()
	route.Store(&deadAddr)
	d, in := routedDriver(t, &route)
	held := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute}
	if _, err := openDriver(t).TryAcquire(testCtx(t), held); err != nil {
		t.Fatal(err)
	}
	// The pool's one connection goes through dead; every later one
	// through slow.
	stuck := backend.Claim{Key: held.Key, Token: newToken(), TTL: time.Minute}
	if _, err := d.TryAcquire(testCtx(t), stuck); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: %v", err)
	}
	route.Store(&slowAddr)
	ch, unsub, err := d.Subscribe(testCtx(t), held.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()
	_ = ch
	dead.Blackhole()

	// Other callers, once the stuck call holds the dead connection: a
	// lock each, refreshed back to back until told to stop, on
	// connections through slow.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	errs := make(chan error, 4)
	others := func() {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute}
				if _, err := d.TryAcquire(context.Background(), l); err != nil {
					errs <- err
					return
				}
				defer d.Release(context.Background(), l)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := d.Refresh(context.Background(), l); err != nil {
						errs <- err
						return
					}
					calls.Add(1)
				}
			}()
		}
	}
	cancelled(t, "Driver.TryAcquire", func(ctx context.Context) error {
		_, err := d.TryAcquire(ctx, stuck)
		return err
	}, others)
	time.Sleep(100 * time.Millisecond) // past any round of cuts
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a healthy call failed: %v", err)
	}
	if n := in.Cuts(); n != 1 {
		t.Errorf("%d reads cut, want 1 (the stuck call's)", n)
	}
	d.dep.mu.Lock()
	h := d.dep.hubs[""]
	var epoch uint64
	if h != nil {
		epoch = h.epoch
	}
	d.dep.mu.Unlock()
	if h == nil || epoch != 0 {
		t.Errorf("the pub/sub connection failed (hub %v, epoch %d)", h != nil, epoch)
	}
	t.Logf("%d healthy calls in flight around the cancel, %d reads cut", calls.Load(), in.Cuts())
}

// BenchmarkInterruptible compares, in turn, TryAcquire + Release through a
// Driver that Open made (interruptible connections, a watch per call, with
// a cancellable context) and through one that New made on a plain client,
// and the same through a Client on each.
func BenchmarkInterruptible(b *testing.B) {
	testenv.Require(b, testenv.RedisAddr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := "redis://" + testenv.RedisAddr() + "/0"
	open := func() *Driver {
		d, err := Open(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	opened, plain := open(), mustNew(b, rdb)
	defer opened.Close()
	defer plain.Close()
	co, err := locker.New(open(), locker.WithNamespace("redislock-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer co.Close()
	cp, err := locker.New(mustNew(b, rdb), locker.WithNamespace("redislock-bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Close()
	key := backend.Key("redislock-bench", "interruptible-"+randHex(4))
	name := "interruptible-" + randHex(4)
	drv := func(d *Driver) func() {
		return func() {
			l := backend.Claim{Key: key, Token: newToken(), TTL: 30 * time.Second}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	}
	client := func(c *locker.Client) func() {
		return func() {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	fns := []func(){drv(opened), drv(plain), client(co), client(cp)}
	for range 200 {
		for _, f := range fns {
			f()
		}
	}
	sums := make([]time.Duration, len(fns))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range fns {
			k := (i + j) % len(fns)
			t := time.Now()
			fns[k]()
			sums[k] += time.Since(t)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(sums[0].Microseconds())/n, "open-driver-µs")
	b.ReportMetric(float64(sums[1].Microseconds())/n, "new-driver-µs")
	b.ReportMetric(float64(sums[0])/float64(sums[1]), "driver-open/new")
	b.ReportMetric(float64(sums[2])/float64(sums[3]), "acquire-open/new")
	b.ReportMetric(0, "ns/op")
}
