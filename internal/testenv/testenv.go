// Package testenv lets tests use the real servers started by
// scripts/services.sh (their addresses come from internal/servers): require
// them, stop and restart them, start private ones, and check TLS setups.
//
// Start the servers with
//
//	scripts/services.sh up
//
// Every address comes from an environment variable (see internal/servers),
// with the default that scripts/services.sh uses:
//
//	LOCKER_REDIS_ADDR              127.0.0.1:6379
//	LOCKER_REDIS_QUORUM_ADDRS      127.0.0.1:6381,...,127.0.0.1:6385
//	LOCKER_REDIS_CLUSTER_ADDRS     127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 (Redis Cluster)
//	LOCKER_MEMCACHE_ADDR           127.0.0.1:11211
//	LOCKER_MEMCACHE_SMALL_ADDR     127.0.0.1:11212 (2 MB, evicts)
//	LOCKER_POSTGRES_URL            postgres://locker@127.0.0.1:5432/locker?sslmode=disable
//	LOCKER_MYSQL_URL               mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker (MariaDB)
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
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/servers"
)

// The addresses live in internal/servers, which commands can import without
// linking testing; these are the same functions, for tests' brevity.
var (
	RedisAddr            = servers.RedisAddr
	RedisQuorumAddrs     = servers.RedisQuorumAddrs
	RedisClusterAddrs    = servers.RedisClusterAddrs
	MemcacheAddr         = servers.MemcacheAddr
	MemcacheSmallAddr    = servers.MemcacheSmallAddr
	RedisRestartAddr     = servers.RedisRestartAddr
	MemcacheRestartAddr  = servers.MemcacheRestartAddr
	PostgresURL          = servers.PostgresURL
	PostgresAddr         = servers.PostgresAddr
	MySQLURL             = servers.MySQLURL
	MySQLAddr            = servers.MySQLAddr
	EtcdEndpoints        = servers.EtcdEndpoints
	EtcdClusterEndpoints = servers.EtcdClusterEndpoints
	ZKAddrs              = servers.ZKAddrs
	ZKEnsemble           = servers.ZKEnsemble
	RedisTLSAddr         = servers.RedisTLSAddr
	PostgresTLSAddr      = servers.PostgresTLSAddr
	MySQLTLSAddr         = servers.MySQLTLSAddr
	EtcdTLSEndpoint      = servers.EtcdTLSEndpoint
	ZKTLSAddr            = servers.ZKTLSAddr
	AdminPassword        = servers.AdminPassword
)

const dialTimeout = 2 * time.Second

// describe names the service listening (or not) at addr.
func describe(addr string) string {
	hp := servers.HostPort(addr)
	for _, in := range servers.Instances() {
		if servers.HostPort(in.Addr) == hp {
			return fmt.Sprintf("%s (instance %s, %s)", in.Service, in.Name, hp)
		}
	}
	return hp
}

// requireServers reports whether an unreachable server must fail the test.
func requireServers() bool {
	return os.Getenv("CI") != "" || os.Getenv(servers.EnvRequireServers) == "1"
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
			c, err := net.DialTimeout("tcp", servers.HostPort(a), dialTimeout)
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
		t.Fatalf("%s (servers are required: CI or %s=1 is set)", msg, servers.EnvRequireServers)
		return
	}
	t.Skipf("%s (or set %s=1 to fail instead of skip)", msg, servers.EnvRequireServers)
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
	for _, in := range servers.Instances() {
		if in.Name != instance {
			continue
		}
		c, err := net.DialTimeout("tcp", servers.HostPort(in.Addr), dialTimeout)
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
	for _, in := range servers.Instances() {
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
