package faults

import (
	"context"
	"fmt"
	"net/url"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"

	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/sqllock/mysql"
	_ "github.com/lockerhq/locker/zklock"
)

// spec describes one backend deployment under test.
type spec struct {
	name string
	// ttl is the lock TTL the cases ask for (etcd: 2 s, its least lease).
	ttl time.Duration
	// start starts the private servers.
	start func(t *testing.T) []*testenv.Server
	// url builds a client URL from the proxied server addresses.
	url func(servers []*testenv.Server, addrs []string) string
	// persistent: the lock survives a server restart.
	persistent bool
	// quorum: how many servers must answer (0: one server, or a cluster
	// that replicates by itself).
	quorum int
}

func specs() []spec {
	one := func(f func(testing.TB) *testenv.Server) func(t *testing.T) []*testenv.Server {
		return func(t *testing.T) []*testenv.Server { return []*testenv.Server{f(t)} }
	}
	return []spec{
		{name: "redis", ttl: time.Second, start: one(testenv.StartRedis),
			url: func(_ []*testenv.Server, a []string) string { return "redis://" + a[0] + "/0" }},
		{name: "redis-fair", ttl: time.Second, start: one(testenv.StartRedis),
			url: func(_ []*testenv.Server, a []string) string { return "redis://" + a[0] + "/0?fair=true" }},
		{name: "redis-quorum", ttl: time.Second, quorum: 3,
			start: func(t *testing.T) []*testenv.Server {
				var s []*testenv.Server
				for i := 0; i < 5; i++ {
					s = append(s, testenv.StartRedis(t))
				}
				return s
			},
			url: func(_ []*testenv.Server, a []string) string { return "redis+quorum://" + strings.Join(a, ",") + "/0" }},
		{name: "memcached", ttl: time.Second, start: one(testenv.StartMemcached),
			url: func(_ []*testenv.Server, a []string) string { return "memcache://" + a[0] }},
		{name: "postgres", ttl: time.Second, persistent: true, start: one(testenv.StartPostgres),
			url: func(_ []*testenv.Server, a []string) string {
				return "postgres://locker@" + a[0] + "/postgres?sslmode=disable"
			}},
		{name: "mariadb", ttl: time.Second, persistent: true, start: one(testenv.StartMariaDB),
			url: func(s []*testenv.Server, a []string) string { return proxied(s[0].URL, a[0]) }},
		{name: "etcd", ttl: 2 * time.Second, persistent: true, start: one(testenv.StartEtcd),
			url: func(_ []*testenv.Server, a []string) string { return "etcd://" + strings.Join(a, ",") }},
		{name: "etcd-cluster", ttl: 2 * time.Second, persistent: true,
			start: func(t *testing.T) []*testenv.Server { return testenv.StartEtcdCluster(t, 3) },
			url:   func(_ []*testenv.Server, a []string) string { return "etcd://" + strings.Join(a, ",") }},
		{name: "zk", ttl: 2 * time.Second, persistent: true, start: one(testenv.StartZK),
			url: func(_ []*testenv.Server, a []string) string {
				return "zk://" + strings.Join(a, ",") + "?session_timeout=2s"
			}},
		{name: "zk-ensemble", ttl: 2 * time.Second, persistent: true,
			start: func(t *testing.T) []*testenv.Server { return testenv.StartZKEnsemble(t, 3) },
			url: func(_ []*testenv.Server, a []string) string {
				return "zk://" + strings.Join(a, ",") + "?session_timeout=2s"
			}},
	}
}

// proxied is raw, a server's URL, with its host:port replaced by addr.
func proxied(raw, addr string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err) // testenv made it
	}
	u.Host = addr
	return u.String()
}

// env is one backend's servers, the clients of a case, and its history.
type env struct {
	t       *testing.T
	spec    spec
	servers []*testenv.Server
	rec     *history.Recorder

	mu      sync.Mutex
	clients []*client
}

func newEnv(t *testing.T, sp spec, servers []*testenv.Server) *env {
	return &env{t: t, spec: sp, servers: servers, rec: history.New()}
}

// client is one locker.Client with a proxy of its own to every server, so
// that a fault can cut one client off and leave the others alone.
type client struct {
	e       *env
	id      string
	proxies []*faultproxy.Proxy
	c       *locker.Client
	labels  context.Context // pprof labels its goroutines carry, for leak checks

	closeOnce sync.Once
	closeErr  error
	closeTook time.Duration
}

// newClient opens a client through fresh proxies; wrap, if set, wraps its driver.
func (e *env) newClient(wrap func(backend.Driver) backend.Driver) *client {
	t := e.t
	t.Helper()
	e.mu.Lock()
	id := fmt.Sprintf("%s/c%d", e.spec.name, len(e.clients)+1)
	e.mu.Unlock()
	cl := &client{e: e, id: id, labels: pprof.WithLabels(context.Background(), pprof.Labels("faultclient", id))}
	var addrs []string
	for _, s := range e.servers {
		p, err := faultproxy.New(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		cl.proxies = append(cl.proxies, p)
		addrs = append(addrs, p.Addr())
	}
	var err error
	// Every goroutine the driver and the Client start carries the label.
	pprof.Do(cl.labels, pprof.Labels(), func(ctx context.Context) {
		octx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var drv backend.Driver
		var opts []locker.Option
		drv, opts, err = locker.OpenDriver(octx, e.spec.url(e.servers, addrs))
		if err != nil {
			return
		}
		if wrap != nil {
			drv = wrap(drv)
		}
		cl.c, err = locker.New(drv, append(opts, locker.WithDefaultTTL(e.spec.ttl))...)
		if err != nil {
			drv.Close()
		}
	})
	if err != nil {
		t.Fatalf("%s: open: %v", id, err)
	}
	t.Cleanup(func() { cl.close() })
	e.mu.Lock()
	e.clients = append(e.clients, cl)
	e.mu.Unlock()
	return cl
}

// close closes the client once and remembers how long it took.
func (cl *client) close() error {
	cl.closeOnce.Do(func() {
		start := time.Now()
		cl.closeErr = cl.c.Close()
		cl.closeTook = time.Since(start)
	})
	return cl.closeErr
}

// Faults on this client's paths only.
func (cl *client) each(f func(p *faultproxy.Proxy)) {
	for _, p := range cl.proxies {
		f(p)
	}
}
func (cl *client) blackhole() { cl.each((*faultproxy.Proxy).Blackhole) }
func (cl *client) heal()      { cl.each((*faultproxy.Proxy).Heal) }
func (cl *client) cut()       { cl.each((*faultproxy.Proxy).Cut) }
func (cl *client) delay(up, down time.Duration) {
	cl.each(func(p *faultproxy.Proxy) { p.Delay(up, down) })
}

// check fails the test on a history violation; the allowance is the
// stated clock margin of the first holder's TTL.
func (e *env) check() history.Result {
	e.t.Helper()
	res := e.rec.Check(history.Options{Allow: func(s history.Snapshot) time.Duration { return backend.ClockMargin(s.TTL) }})
	if !res.OK() {
		e.t.Errorf("history of %s:\n%s", e.spec.name, res.Report())
	}
	return res
}
