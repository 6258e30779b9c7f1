package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/servers"
)

// clearEnv blanks every address variable for the test (blank means unset here).
func clearEnv(t *testing.T) {
	for _, k := range []string{servers.EnvRedisAddr, servers.EnvRedisQuorumAddrs, servers.EnvRedisClusterAddrs, servers.EnvEtcdClusterEndpoints} {
		t.Setenv(k, "")
	}
}

// Require names the instance an address belongs to.
func TestDescribe(t *testing.T) {
	clearEnv(t)
	if got := describe("http://127.0.0.1:23792"); !strings.Contains(got, "etcd-c2") {
		t.Errorf("describe(etcd-c2 endpoint) = %q, want it to name etcd-c2", got)
	}
	if got := describe("127.0.0.1:6383"); !strings.Contains(got, "redis-q3") || !strings.Contains(got, "redis") {
		t.Errorf("describe(redis-q3) = %q", got)
	}
	if got := describe("127.0.0.1:7102"); !strings.Contains(got, "redis-c2") || !strings.Contains(got, "cluster") {
		t.Errorf("describe(redis-c2) = %q", got)
	}
	if knownInstance("nope") || !knownInstance("zk-e3") {
		t.Error("knownInstance is wrong")
	}
}

func TestScriptPath(t *testing.T) {
	p, err := ScriptPath()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(p, "/scripts/services.sh") {
		t.Errorf("ScriptPath() = %q", p)
	}
}

// fakeTB records what Require does instead of stopping the test.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = true
	f.msg = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRequireUnreachable(t *testing.T) {
	clearEnv(t)
	addr := closedAddr(t)
	t.Setenv(servers.EnvRedisAddr, addr) // so that the message names the service

	for _, tc := range []struct {
		ci, require string
		wantFail    bool
	}{
		{"", "", false},
		{"true", "", true},
		{"", "1", true},
		{"", "0", false},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv(servers.EnvRequireServers, tc.require)
		f := &fakeTB{}
		Require(f, addr)
		if f.failed != tc.wantFail || f.skipped == tc.wantFail {
			t.Errorf("CI=%q %s=%q: failed=%v skipped=%v, want failed=%v",
				tc.ci, servers.EnvRequireServers, tc.require, f.failed, f.skipped, tc.wantFail)
		}
		for _, want := range []string{"redis", "instance redis,", addr, "scripts/services.sh up"} {
			if !strings.Contains(f.msg, want) {
				t.Errorf("message %q does not contain %q", f.msg, want)
			}
		}
	}
}

func TestRequireReachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("CI", "true")
	f := &fakeTB{}
	Require(f, l.Addr().String(), "http://"+l.Addr().String())
	if f.failed || f.skipped {
		t.Errorf("Require on a listening address: failed=%v skipped=%v (%s)", f.failed, f.skipped, f.msg)
	}
}

func TestUnknownInstance(t *testing.T) {
	if err := runScript("stop", "no-such-instance"); err == nil {
		t.Error("runScript accepted an unknown instance")
	}
}

// redisPing sends PING and expects +PONG.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// With the servers up (scripts/services.sh up), Require passes for redis and
// redis answers.
func TestRequireRedis(t *testing.T) {
	Require(t, RedisAddr())
	if err := redisPing(RedisAddr()); err != nil {
		t.Fatal(err)
	}
}

// TestStopStart stops and restarts redis-q5 through the script. Other packages
// may be using that server, so it only runs with LOCKER_TESTENV_RESTART=1.
func TestStopStart(t *testing.T) {
	if os.Getenv("LOCKER_TESTENV_RESTART") != "1" {
		t.Skip("set LOCKER_TESTENV_RESTART=1 to stop and restart redis-q5")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	addr := RedisQuorumAddrs()[4]
	Require(t, addr)
	Stop(t, "redis-q5")
	if err := redisPing(addr); err == nil {
		t.Fatal("redis-q5 still answers after Stop")
	}
	Start(t, "redis-q5")
	if err := redisPing(addr); err != nil {
		t.Fatalf("redis-q5 after Start: %v", err)
	}
}
