package testenv

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ask sends a request and waits at most d for the wanted answer.
func ask(addr, req, want string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return exchange(ctx, addr, req, want)
}

// checkGone fails if the process still exists.
func checkGone(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 50; i++ {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d still exists", pid)
}

func TestPrivateRedisPauseResumeRestart(t *testing.T) {
	s := StartRedis(t)
	if err := ask(s.Addr, "SET k v\r\n", "+OK", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := ask(s.Addr, "PING\r\n", "+PONG", 300*time.Millisecond); err == nil {
		t.Fatal("a paused redis answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := ask(s.Addr, "GET k\r\n", "$1\r\nv", 2*time.Second); err != nil {
		t.Fatalf("after resume: %v", err)
	}
	old := s.PID()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	checkGone(t, old)
	if s.PID() == old {
		t.Fatal("same pid after restart")
	}
	// No persistence: the key is gone.
	if err := ask(s.Addr, "GET k\r\n", "$-1", 2*time.Second); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	// Stop works on a paused server.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	checkGone(t, pid)
}

func TestPrivateMemcachedKillRestart(t *testing.T) {
	s := StartMemcached(t)
	if err := ask(s.Addr, "set k 0 0 1\r\nv\r\n", "STORED", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := ask(s.Addr, "version\r\n", "VERSION", 300*time.Millisecond); err == nil {
		t.Fatal("a killed memcached answered")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ask(s.Addr, "get k\r\n", "END", 2*time.Second); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestPrivatePostgres(t *testing.T) {
	s := StartPostgres(t)
	psql := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, pgBin(t)+"/psql", s.URL, "-XAtqc", "select 1").Run()
	}
	if err := psql(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := exec.CommandContext(ctx, pgBin(t)+"/psql", s.URL, "-XAtqc", "select 1").Run()
	cancel()
	if err == nil {
		t.Fatal("a paused postgres answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := psql(); err != nil {
		t.Fatalf("after resume: %v", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := psql(); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestPrivateMariaDB(t *testing.T) {
	s := StartMariaDB(t)
	client := needBinary(t, "mariadb")
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	// sql runs queries as the URL's user in its database, over TCP.
	sql := func(d time.Duration, query string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		c := exec.CommandContext(ctx, client, "--no-defaults", "--protocol=tcp", "-h", u.Hostname(), "-P", u.Port(),
			"-u", u.User.Username(), "--connect-timeout=2", "-NBe", query, strings.TrimPrefix(u.Path, "/"))
		c.Env = append(os.Environ(), "MYSQL_PWD="+password)
		out, err := c.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	want42 := func(when string) {
		t.Helper()
		if out, err := sql(5*time.Second, "select x from t"); err != nil || out != "42" {
			t.Fatalf("%s: select = %q, %v; want 42", when, out, err)
		}
	}
	if out, err := sql(5*time.Second, "create table t (x int) engine=InnoDB; insert into t values (42)"); err != nil {
		t.Fatalf("create table: %v: %s", err, out)
	}
	want42("after insert")
	if out, err := sql(5*time.Second, "create database other"); err == nil || !strings.Contains(out, "denied") {
		t.Fatalf("the user may create another database: %v: %s", err, out)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := sql(time.Second, "select 1"); err == nil {
		t.Fatal("a paused mariadb answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	want42("after resume")
	// Restart kills it: the committed row is in the log the server wrote.
	old := s.PID()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	checkGone(t, old)
	want42("after kill and restart")
	pid := s.PID()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	checkGone(t, pid)
	if err := mariaDBGreeting(context.Background(), s); err == nil {
		t.Fatal("a stopped mariadb answered")
	}
}

func TestPrivateEtcd(t *testing.T) {
	s := StartEtcd(t)
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := etcdHealthy(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func TestPrivateEtcdCluster(t *testing.T) {
	ms := StartEtcdCluster(t, 3)
	if err := ms[0].Kill(); err != nil {
		t.Fatal(err)
	}
	// Two of three keep a quorum.
	if err := ms[1].WaitReady(); err != nil {
		t.Fatal(err)
	}
	if err := ms[0].Start(); err != nil {
		t.Fatalf("the killed member does not rejoin: %v", err)
	}
}

func TestPrivateZK(t *testing.T) {
	s := StartZK(t)
	if err := ask(s.Addr, "srvr", "Mode: standalone", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := ask(s.Addr, "srvr", "Mode: ", 300*time.Millisecond); err == nil {
		t.Fatal("a paused zookeeper answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitReady(); err != nil {
		t.Fatal(err)
	}
}

func TestPrivateZKEnsemble(t *testing.T) {
	ms := StartZKEnsemble(t, 3)
	if err := ms[2].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := ms[0].WaitReady(); err != nil {
		t.Fatal(err)
	}
	if err := ms[2].Start(); err != nil {
		t.Fatalf("the killed server does not rejoin: %v", err)
	}
}
