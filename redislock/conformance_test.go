package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// harness runs the suite on the single server.
type harness struct {
	admin   *redis.Client
	proxies *proxies
}

func (h harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, "redis://"+testenv.RedisAddr()+"/0", suiteRestartDelay, suiteRetention)
}

// NewCutDriver implements conformance.Outager: a driver that reaches the
// server through a proxy of its own.
func (h harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	p, down, err := h.proxies.new(testenv.RedisAddr())
	if err != nil {
		return nil, nil, err
	}
	d, err := Open(ctx, "redis://"+p.Addr()+"/0", suiteRestartDelay, suiteRetention)
	if err != nil {
		return nil, nil, err
	}
	return d, down, nil
}

// Residue implements conformance.ResidueCounter.
func (h harness) Residue(ctx context.Context, key string) (int, error) {
	return residue(ctx, h.admin, key)
}

// suiteRestartDelay keeps the restart check on (every name of the suite is
// new, so every first acquisition reads the server's uptime) but caps it at
// a second: the suite asks for TTLs up to 720h, which a server started less
// than 720h ago would refuse by default. The shared servers run for longer
// than a second before any test. The quorum's suite runs with the check
// off, as the package's tests do by default (main_test.go): TwoDown's
// private servers start moments before it.
var suiteRestartDelay = WithRestartDelay(time.Second)

// suiteRetention is the fence counters' retention in the suite, short so
// that ForgetsReleasedNames sees a released name vanish.
const suiteRetentionTime = 2 * time.Second

var suiteRetention = WithRetention(suiteRetentionTime)

// residue counts every key of key's state (lock, fence counter, queue,
// liveness) on every server of admin, with SCAN: a cluster's masters one
// by one.
func residue(ctx context.Context, admin redis.UniversalClient, key string) (int, error) {
	pattern := "{" + backend.EscapeKey(key) + "}:*" // EscapeKey leaves no glob character
	count := func(ctx context.Context, c *redis.Client) (int, error) {
		n := 0
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			n++
		}
		return n, iter.Err()
	}
	cc, ok := admin.(*redis.ClusterClient)
	if !ok {
		return count(ctx, admin.(*redis.Client))
	}
	var mu sync.Mutex
	total := 0
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := count(ctx, c)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	return total, err
}

// proxies are the fault proxies of a run's cut drivers, closed when the
// run ends.
type proxies struct {
	t  *testing.T
	mu sync.Mutex
}

func newProxies(t *testing.T) *proxies { return &proxies{t: t} }

// new starts a proxy to addr, and its switch: down(true) resets its
// connections and refuses new ones.
func (ps *proxies) new(addr string) (*faultproxy.Proxy, func(bool), error) {
	p, err := faultproxy.New(addr)
	if err != nil {
		return nil, nil, err
	}
	ps.mu.Lock()
	ps.t.Cleanup(func() { p.Close() })
	ps.mu.Unlock()
	return p, func(down bool) {
		p.Refuse(down)
		if down {
			p.Cut()
		}
	}, nil
}

func (h harness) Expire(ctx context.Context, key string) error {
	return expireLock(ctx, h.admin, key)
}

func (h harness) Traits() conformance.Traits {
	// Blocked waiters queue and are handed the lock in arrival order. A
	// queue outlives its last waiter's last try by 2*livenessTTL.
	return conformance.Traits{TTL: 500 * time.Millisecond, FIFO: backend.Modes(backend.Exclusive, backend.Permit), Retention: max(suiteRetentionTime, 2*livenessTTL)}
}

// expireLock deletes key's lock, as if its TTL had run out.
func expireLock(ctx context.Context, admin redis.UniversalClient, key string) error {
	n, err := admin.Del(ctx, keysFor(key).lock).Result()
	if err == nil && n == 0 {
		err = fmt.Errorf("no lock on %q to expire", key)
	}
	return err
}

func TestConformance(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	admin := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer admin.Close()
	conformance.Run(t, harness{admin: admin, proxies: newProxies(t)})
}

// quorumHarness runs the suite on the five independent servers.
type quorumHarness struct {
	admins []*redis.Client
	addrs  []string
	ignore []string
	// stopped are the servers a test stopped, by index: no residue to count.
	stopped map[int]bool
}

func newQuorumHarness(t *testing.T, addrs []string) *quorumHarness {
	h := &quorumHarness{addrs: addrs}
	for _, a := range h.addrs {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		h.admins = append(h.admins, c)
	}
	return h
}

func (h *quorumHarness) url() string {
	return "redis+quorum://" + strings.Join(h.addrs, ",") + "/0"
}

func (h *quorumHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return OpenQuorum(ctx, h.url(), suiteRetention)
}

// Residue implements conformance.ResidueCounter: the name's keys on every
// server.
func (h *quorumHarness) Residue(ctx context.Context, key string) (int, error) {
	total := 0
	for i, c := range h.admins {
		if h.stopped[i] {
			continue
		}
		n, err := residue(ctx, c, key)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func (h *quorumHarness) Expire(ctx context.Context, key string) error {
	deleted := 0
	var errs []error
	for _, c := range h.admins {
		n, err := c.Del(ctx, keysFor(key).lock).Result()
		if err != nil {
			errs = append(errs, err)
		}
		deleted += int(n)
	}
	if deleted == 0 {
		return fmt.Errorf("no lock on %q to expire: %w", key, errors.Join(errs...))
	}
	return nil
}

func (h *quorumHarness) Traits() conformance.Traits {
	// Servers keep the key about 1% + 2ms past the TTL (the drift
	// allowance), so a lock frees that much later than its TTL. 1s rather
	// than 500ms: an acquisition takes two rounds of requests to five
	// servers, and on a loaded two-core machine under -race a 500ms lease
	// leaves too little margin for the suite's timing.
	return conformance.Traits{TTL: time.Second, Granularity: 20 * time.Millisecond, IgnoreGoroutines: h.ignore, Retention: suiteRetentionTime}
}

func TestConformanceQuorum(t *testing.T) {
	h := newQuorumHarness(t, testenv.RedisQuorumAddrs())
	testenv.Require(t, h.addrs...)
	conformance.Run(t, h)
}

// TestConformanceQuorumTwoDown runs the suite with two of the five servers
// stopped, servers of its own: a majority of three still decides.
func TestConformanceQuorumTwoDown(t *testing.T) {
	srvs, addrs := privateQuorum(t)
	h := newQuorumHarness(t, addrs)
	for _, s := range srvs[3:] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	// While a server is down, each go-redis connection pool that failed to
	// reach it probes it in the background (ConnPool.tryDial, once a
	// second) until it answers or the client is closed. Clients that a
	// case keeps open across its leak check (the other holder's) own such
	// probes; they are not the driver's goroutines.
	h.ignore = []string{"pool.(*ConnPool).tryDial"}
	h.stopped = map[int]bool{3: true, 4: true}
	conformance.Run(t, h)
}

// clusterHarness runs the suite on the 3-node Redis Cluster that
// scripts/services.sh runs (instances redis-c1..redis-c3;
// LOCKER_REDIS_CLUSTER_ADDRS, host:port,..., names another). Locks and
// fences hash to one slot per name; releases published on one node reach
// waiters subscribed on another.
type clusterHarness struct {
	url   string
	admin *redis.ClusterClient
}

func (h clusterHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, h.url, suiteRestartDelay, suiteRetention)
}

// Residue implements conformance.ResidueCounter.
func (h clusterHarness) Residue(ctx context.Context, key string) (int, error) {
	return residue(ctx, h.admin, key)
}

func (h clusterHarness) Expire(ctx context.Context, key string) error {
	return expireLock(ctx, h.admin, key)
}

func (h clusterHarness) Traits() conformance.Traits {
	// Blocked waiters queue and are handed the lock in arrival order. A
	// queue outlives its last waiter's last try by 2*livenessTTL.
	return conformance.Traits{TTL: 500 * time.Millisecond, FIFO: backend.Modes(backend.Exclusive, backend.Permit), Retention: max(suiteRetentionTime, 2*livenessTTL)}
}

func TestConformanceCluster(t *testing.T) {
	addrs := testenv.RedisClusterAddrs()
	testenv.Require(t, addrs...)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	conformance.Run(t, clusterHarness{url: "redis+cluster://" + strings.Join(addrs, ","), admin: admin})
}

// fairHarness runs the suite with FairDrivers, which claim FIFO and keep
// an entry per waiter, on the single server or on the cluster.
type fairHarness struct {
	url     string
	admin   redis.UniversalClient
	proxies *proxies // nil: no Outager (the cluster's)
	addr    string   // the server the url names, for a proxy to it
}

func (h fairHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return OpenFair(ctx, h.url, suiteRestartDelay, suiteRetention)
}

// Residue implements conformance.ResidueCounter.
func (h fairHarness) Residue(ctx context.Context, key string) (int, error) {
	return residue(ctx, h.admin, key)
}

func (h fairHarness) Expire(ctx context.Context, key string) error {
	return expireLock(ctx, h.admin, key)
}

func (h fairHarness) Traits() conformance.Traits {
	// A queue outlives its last waiter's last try by 2*livenessTTL.
	return conformance.Traits{TTL: 500 * time.Millisecond, FIFO: backend.Modes(backend.Exclusive, backend.Permit), Retention: max(suiteRetentionTime, 2*livenessTTL)}
}

// fairCutHarness is fairHarness with an Outager: the single server's, a
// proxy in front of one server.
type fairCutHarness struct{ fairHarness }

func (h fairCutHarness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	p, down, err := h.proxies.new(h.addr)
	if err != nil {
		return nil, nil, err
	}
	d, err := OpenFair(ctx, "redis://"+p.Addr()+"/0", suiteRestartDelay, suiteRetention)
	if err != nil {
		return nil, nil, err
	}
	return d, down, nil
}

// Entries counts the holders and the queued waiters, dead or alive, of
// key's lock, semaphore and read-write lock, read in one transaction: a
// waiter joins or leaves both of its queue's keys in one script.
func (h fairHarness) Entries(ctx context.Context, key string) (int, error) {
	var held *redis.IntCmd
	var counts [][2]*redis.IntCmd // holders, or a queue's entries and liveness records
	_, err := h.admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		k := keysFor(key)
		held = p.Exists(ctx, k.lock)
		counts = append(counts, [2]*redis.IntCmd{p.ZCard(ctx, k.queue), p.HLen(ctx, k.live)})
		for _, m := range []backend.Mode{backend.Permit, backend.Read} {
			ks := fairSharedKeys(backend.Claim{Key: key, Mode: m})
			counts = append(counts, [2]*redis.IntCmd{p.ZCard(ctx, ks[0]), nil}, [2]*redis.IntCmd{p.ZCard(ctx, ks[3]), p.HLen(ctx, ks[4])})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	total := int(held.Val())
	for _, c := range counts {
		if c[1] != nil && c[0].Val() != c[1].Val() {
			return 0, fmt.Errorf("%s: %d waiters queued but %d with a liveness entry", c[0].Args()[1], c[0].Val(), c[1].Val())
		}
		total += int(c[0].Val())
	}
	return total, nil
}

func TestConformanceFair(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	admin := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer admin.Close()
	conformance.Run(t, fairCutHarness{fairHarness{url: "redis://" + testenv.RedisAddr() + "/0?fair=true", admin: admin, proxies: newProxies(t), addr: testenv.RedisAddr()}})
}

func TestConformanceFairCluster(t *testing.T) {
	addrs := testenv.RedisClusterAddrs()
	testenv.Require(t, addrs...)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	conformance.Run(t, fairHarness{url: "redis+cluster://" + strings.Join(addrs, ",") + "?fair=true", admin: admin})
}
