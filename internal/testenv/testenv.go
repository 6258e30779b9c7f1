// Package testenv tells tests where the real servers started by scripts/services.sh
// listen, and lets them stop and restart those servers.
//
// Start the servers with
//
//	scripts/services.sh up
//
// Every address comes from an environment variable, with the default that
// scripts/services.sh uses:
//
//	LOCKER_REDIS_ADDR              127.0.0.1:6379
//	LOCKER_REDIS_QUORUM_ADDRS      127.0.0.1:6381,...,127.0.0.1:6385
//	LOCKER_REDIS_CLUSTER_ADDRS     127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 (Redis Cluster)
//	LOCKER_MEMCACHE_ADDR           127.0.0.1:11211
//	LOCKER_MEMCACHE_SMALL_ADDR     127.0.0.1:11212 (2 MB, evicts)
//	LOCKER_POSTGRES_URL            postgres://locker@127.0.0.1:5432/locker?sslmode=disable
//	LOCKER_ETCD_ENDPOINTS          127.0.0.1:2379
//	LOCKER_ETCD_CLUSTER_ENDPOINTS  127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793
//	LOCKER_ZK_ADDR                 127.0.0.1:2181
//	LOCKER_ZK_ENSEMBLE             127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184
//
// A test calls [Require] with the addresses it needs before it uses them. An
// unreachable server skips the test, except in CI (CI is set, or
// LOCKER_REQUIRE_SERVERS=1), where it fails it.
//
// Limits worth knowing when writing tests: etcd grants no lease shorter than
// 2 s (a smaller TTL becomes 2 s); ZooKeeper clamps session timeouts into
// [1 s, 60 s].
//
// The servers are shared by every test package, and go test runs packages in
// parallel: a test that calls [Stop] affects any other package using the same
// instance at that moment.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables read by this package and by scripts/services.sh.
const (
	EnvRedisAddr            = "LOCKER_REDIS_ADDR"
	EnvRedisQuorumAddrs     = "LOCKER_REDIS_QUORUM_ADDRS"
	EnvRedisClusterAddrs    = "LOCKER_REDIS_CLUSTER_ADDRS"
	EnvMemcacheAddr         = "LOCKER_MEMCACHE_ADDR"
	EnvMemcacheSmallAddr    = "LOCKER_MEMCACHE_SMALL_ADDR"
	EnvRedisRestartAddr     = "LOCKER_REDIS_RESTART_ADDR"
	EnvMemcacheRestartAddr  = "LOCKER_MEMCACHE_RESTART_ADDR"
	EnvPostgresURL          = "LOCKER_POSTGRES_URL"
	EnvEtcdEndpoints        = "LOCKER_ETCD_ENDPOINTS"
	EnvEtcdClusterEndpoints = "LOCKER_ETCD_CLUSTER_ENDPOINTS"
	EnvZKAddr               = "LOCKER_ZK_ADDR"
	EnvZKEnsemble           = "LOCKER_ZK_ENSEMBLE"

	// EnvRequireServers set to 1 makes Require fail instead of skip, as CI does.
	EnvRequireServers = "LOCKER_REQUIRE_SERVERS"
)

// Defaults, matching scripts/services.sh.
const (
	DefaultRedisAddr            = "127.0.0.1:6379"
	DefaultRedisQuorumAddrs     = "127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383,127.0.0.1:6384,127.0.0.1:6385"
	DefaultRedisClusterAddrs    = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
	DefaultMemcacheAddr         = "127.0.0.1:11211"
	DefaultMemcacheSmallAddr    = "127.0.0.1:11212"
	DefaultRedisRestartAddr     = "127.0.0.1:6386"
	DefaultMemcacheRestartAddr  = "127.0.0.1:11213"
	DefaultPostgresURL          = "postgres://locker@127.0.0.1:5432/locker?sslmode=disable"
	DefaultEtcdEndpoints        = "127.0.0.1:2379"
	DefaultEtcdClusterEndpoints = "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793"
	DefaultZKAddr               = "127.0.0.1:2181"
	DefaultZKEnsemble           = "127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184"
)

const dialTimeout = 2 * time.Second

// env returns the trimmed value of the variable, or def when it is unset or blank.
func env(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// list splits a comma-separated value, dropping blanks.
func list(name, def string) []string {
	var out []string
	for _, s := range strings.Split(env(name, def), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// RedisAddr is the host:port of the single Redis server (instance "redis").
func RedisAddr() string { return env(EnvRedisAddr, DefaultRedisAddr) }

// RedisQuorumAddrs are the host:port of 5 independent Redis servers
// (instances "redis-q1".."redis-q5"), for quorum (Redlock-style) locks.
func RedisQuorumAddrs() []string { return list(EnvRedisQuorumAddrs, DefaultRedisQuorumAddrs) }

// RedisClusterAddrs are the host:port of the 3 masters of a Redis Cluster
// (instances "redis-c1".."redis-c3", no replicas). scripts/services.sh forms
// the cluster and reports the group ready once cluster_state is ok.
func RedisClusterAddrs() []string { return list(EnvRedisClusterAddrs, DefaultRedisClusterAddrs) }

// MemcacheAddr is the host:port of the memcached server (instance "memcached").
func MemcacheAddr() string { return env(EnvMemcacheAddr, DefaultMemcacheAddr) }

// MemcacheSmallAddr is the host:port of a memcached server with 2 MB of memory
// (instance "memcached-small"), for eviction tests.
func MemcacheSmallAddr() string { return env(EnvMemcacheSmallAddr, DefaultMemcacheSmallAddr) }

// RedisRestartAddr is the host:port of a Redis server that only tests which
// stop and restart it use (instance "redis-restart"): packages test in
// parallel, and a restart of a shared server would break the others.
func RedisRestartAddr() string { return env(EnvRedisRestartAddr, DefaultRedisRestartAddr) }

// MemcacheRestartAddr is the host:port of a memcached server that only tests
// which stop and restart it use (instance "memcached-restart").
func MemcacheRestartAddr() string { return env(EnvMemcacheRestartAddr, DefaultMemcacheRestartAddr) }

// PostgresURL is the connection URL of the PostgreSQL database (instance "postgres").
func PostgresURL() string { return env(EnvPostgresURL, DefaultPostgresURL) }

// PostgresAddr is the host:port of PostgresURL, for Require.
func PostgresAddr() string {
	u, err := url.Parse(PostgresURL())
	if err != nil || u.Host == "" {
		return "127.0.0.1:5432"
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5432")
	}
	return u.Host
}

// EtcdEndpoints are the client endpoints (host:port) of the single-member etcd (instance "etcd").
func EtcdEndpoints() []string { return list(EnvEtcdEndpoints, DefaultEtcdEndpoints) }

// EtcdClusterEndpoints are the client endpoints of the 3-member etcd cluster
// (instances "etcd-c1".."etcd-c3").
func EtcdClusterEndpoints() []string {
	return list(EnvEtcdClusterEndpoints, DefaultEtcdClusterEndpoints)
}

// ZKAddrs are the servers (host:port) of the standalone ZooKeeper (instance "zk").
func ZKAddrs() []string { return list(EnvZKAddr, DefaultZKAddr) }

// ZKEnsemble are the servers of the 3-server ZooKeeper ensemble (instances "zk-e1".."zk-e3").
func ZKEnsemble() []string { return list(EnvZKEnsemble, DefaultZKEnsemble) }

// Instance is one server run by scripts/services.sh.
type Instance struct {
	Name    string // instance name for Stop and Start, e.g. "redis-q2"
	Service string // what it is, e.g. "redis quorum member"
	Addr    string // host:port
}

// Instances lists every instance with its current address, in the order
// scripts/services.sh status prints them.
func Instances() []Instance {
	var out []Instance
	add := func(name, service, addr string) {
		out = append(out, Instance{Name: name, Service: service, Addr: addr})
	}
	addList := func(prefix, service string, addrs []string) {
		for i, a := range addrs {
			add(prefix+strconv.Itoa(i+1), service, a)
		}
	}
	add("redis", "redis", RedisAddr())
	addList("redis-q", "redis quorum member", RedisQuorumAddrs())
	addList("redis-c", "redis cluster node", RedisClusterAddrs())
	add("memcached", "memcached", MemcacheAddr())
	add("memcached-small", "memcached (small)", MemcacheSmallAddr())
	add("redis-restart", "redis (restart tests)", RedisRestartAddr())
	add("memcached-restart", "memcached (restart tests)", MemcacheRestartAddr())
	add("postgres", "postgres", PostgresAddr())
	for _, a := range EtcdEndpoints() {
		add("etcd", "etcd", a)
	}
	addList("etcd-c", "etcd cluster member", EtcdClusterEndpoints())
	for _, a := range ZKAddrs() {
		add("zk", "zookeeper", a)
	}
	addList("zk-e", "zookeeper ensemble member", ZKEnsemble())
	add("redis-tls", "redis (TLS, ACL)", RedisTLSAddr())
	add("postgres-tls", "postgres (TLS, scram)", PostgresTLSAddr())
	add("etcd-tls", "etcd (TLS, RBAC)", EtcdTLSEndpoint())
	add("zk-tls", "zookeeper (TLS)", ZKTLSAddr())
	return out
}

// hostPort strips a URL scheme and path from an endpoint: "http://h:1/x" -> "h:1".
func hostPort(addr string) string {
	if i := strings.Index(addr, "://"); i >= 0 {
		addr = addr[i+3:]
	}
	if i := strings.IndexByte(addr, '/'); i >= 0 {
		addr = addr[:i]
	}
	return addr
}

// describe names the service listening (or not) at addr.
func describe(addr string) string {
	hp := hostPort(addr)
	for _, in := range Instances() {
		if hostPort(in.Addr) == hp {
			return fmt.Sprintf("%s (instance %s, %s)", in.Service, in.Name, hp)
		}
	}
	return hp
}

// requireServers reports whether an unreachable server must fail the test.
func requireServers() bool {
	return os.Getenv("CI") != "" || os.Getenv(EnvRequireServers) == "1"
}

// Require dials every address (host:port, or an http:// endpoint) over TCP,
// with a 2 s timeout. If one does not answer, it skips the test, or fails it
// when CI is set or LOCKER_REQUIRE_SERVERS=1: in CI a missing server is an
// error, never a skip.
func Require(t testing.TB, addrs ...string) {
	t.Helper()
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", hostPort(a), dialTimeout)
			if err != nil {
				errs[i] = fmt.Errorf("%s is unreachable: %w", describe(a), err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	var down []string
	for _, err := range errs {
		if err != nil {
			down = append(down, err.Error())
		}
	}
	if len(down) == 0 {
		return
	}
	msg := "testenv: " + strings.Join(down, "; ") + "; start the test servers with `scripts/services.sh up`"
	if requireServers() {
		t.Fatalf("%s (servers are required: CI or %s=1 is set)", msg, EnvRequireServers)
		return
	}
	t.Skipf("%s (or set %s=1 to fail instead of skip)", msg, EnvRequireServers)
}

// Stop stops one instance (e.g. "redis-q1", "etcd-c2", "zk-e1") with
// `scripts/services.sh stop NAME`, failing the test if that fails. When the
// test ends the instance is started again if it is still down, so a failed
// test does not leave it stopped for the next one.
func Stop(t testing.TB, instance string) {
	t.Helper()
	if err := runScript("stop", instance); err != nil {
		t.Fatalf("testenv: stop %s: %v", instance, err)
	}
	t.Cleanup(func() {
		if err := runScript("start", instance); err != nil {
			t.Errorf("testenv: restarting %s after the test: %v", instance, err)
		}
	})
}

// Start starts one instance again with `scripts/services.sh start NAME`,
// reusing its data directory, and returns once it answers. It fails the test
// if the instance does not come back.
func Start(t testing.TB, instance string) {
	t.Helper()
	if err := runScript("start", instance); err != nil {
		t.Fatalf("testenv: start %s: %v", instance, err)
	}
	for _, in := range Instances() {
		if in.Name != instance {
			continue
		}
		c, err := net.DialTimeout("tcp", hostPort(in.Addr), dialTimeout)
		if err != nil {
			t.Fatalf("testenv: %s started but %s does not answer: %v", instance, in.Addr, err)
		}
		c.Close()
	}
}

// scriptTimeout bounds one run of the script; it waits at most 60 s for a server.
const scriptTimeout = 3 * time.Minute

func runScript(cmd, instance string) error {
	if !knownInstance(instance) {
		return fmt.Errorf("unknown instance %q", instance)
	}
	script, err := ScriptPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", script, cmd, instance)
	c.Dir = filepath.Dir(filepath.Dir(script))
	var out bytes.Buffer
	c.Stdout = &out
	c.Stderr = &out
	// The script leaves the server running with its output in a log file; do not
	// wait for pipes a stray child might still hold.
	c.WaitDelay = 5 * time.Second
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s %s %s: %w\n%s", script, cmd, instance, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func knownInstance(name string) bool {
	for _, in := range Instances() {
		if in.Name == name {
			return true
		}
	}
	return false
}

// ScriptPath returns the path of scripts/services.sh: the repository root is
// found by walking up from the working directory (go test runs in the package
// directory), then from this source file, to the directory holding go.mod.
func ScriptPath() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				p := filepath.Join(dir, "scripts", "services.sh")
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("scripts/services.sh not found: no go.mod with scripts/services.sh above the working directory")
}
