package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The settings follow scripts/services.sh, so that private servers behave
// as the shared ones do.

// StartRedis starts a private redis-server without persistence.
func StartRedis(t testing.TB) *Server {
	t.Helper()
	return StartRedisWith(t)
}

// StartRedisWith is StartRedis with extra arguments on the command line.
func StartRedisWith(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := needBinary(t, "redis-server")
	port := FreePorts(t, 1)[0]
	s := &Server{Kind: "redis", Name: "redis-" + strconv.Itoa(port), Addr: loopback(port), dir: t.TempDir(), startIn: 20 * time.Second}
	s.command = func() *exec.Cmd {
		return exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes",
			"--maxmemory-policy", "noeviction", "--enable-debug-command", "local"}, extra...)...)
	}
	s.ready = func(ctx context.Context, s *Server) error { return exchange(ctx, s.Addr, "PING\r\n", "+PONG") }
	return newServer(t, s)
}

// StartRedisTLS starts a private redis-server that also listens with TLS,
// on the returned address, presenting certs' server certificate and
// requiring a client certificate from certs' CA. Its plain port (Addr)
// answers only on loopback, for the readiness check and the tests' admin.
func StartRedisTLS(t testing.TB, certs *Certs) (*Server, string) {
	t.Helper()
	port := FreePorts(t, 1)[0]
	s := StartRedisWith(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", certs.ServerCert,
		"--tls-key-file", certs.ServerKey, "--tls-ca-cert-file", certs.CA, "--tls-auth-clients", "yes")
	return s, loopback(port)
}

// StartMemcached starts a private memcached (64 MB, UDP off).
func StartMemcached(t testing.TB) *Server {
	t.Helper()
	bin := needBinary(t, "memcached")
	port := FreePorts(t, 1)[0]
	s := &Server{Kind: "memcached", Name: "memcached-" + strconv.Itoa(port), Addr: loopback(port), dir: t.TempDir(), startIn: 20 * time.Second}
	args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "2"}
	if os.Geteuid() == 0 {
		u := "nobody"
		if _, err := user.Lookup("memcache"); err == nil {
			u = "memcache"
		}
		args = append(args, "-u", u)
	}
	s.command = func() *exec.Cmd { return exec.Command(bin, args...) }
	s.ready = func(ctx context.Context, s *Server) error { return exchange(ctx, s.Addr, "version\r\n", "VERSION") }
	return newServer(t, s)
}

// pgBin is the directory of the PostgreSQL binaries.
func pgBin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append([]string{"/usr/lib/postgresql/15/bin"}, dirs...) {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	needBinary(t, "/usr/lib/postgresql/15/bin/postgres")
	return ""
}

// StartPostgres starts a private PostgreSQL cluster (initdb with trust
// auth, fsync off) and sets URL to its "postgres" database as superuser
// "locker". Started as root, it runs as user postgres.
func StartPostgres(t testing.TB) *Server {
	t.Helper()
	return StartPostgresWith(t)
}

// StartPostgresWith is StartPostgres with extra arguments on the command
// line, after its own (a later -c name=value wins).
func StartPostgresWith(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := pgBin(t)
	port := FreePorts(t, 1)[0]
	// t.TempDir's parents are private to root; postgres needs its own.
	dir, err := os.MkdirTemp("", "locker-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root needs a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	asPostgres := func(c *exec.Cmd) *exec.Cmd {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		c.Dir = dir
		return c
	}
	data := filepath.Join(dir, "data")
	initdb := asPostgres(exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "locker",
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"))
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	s := &Server{
		Kind: "postgres", Name: "postgres-" + strconv.Itoa(port), Addr: loopback(port), dir: dir,
		URL:     fmt.Sprintf("postgres://locker@127.0.0.1:%d/postgres?sslmode=disable", port),
		startIn: 30 * time.Second,
		stopSig: syscall.SIGINT, // fast shutdown: SIGTERM would wait for clients
	}
	s.command = func() *exec.Cmd {
		return asPostgres(exec.Command(filepath.Join(bin, "postgres"), append([]string{"-D", data,
			"-c", "listen_addresses=127.0.0.1", "-c", "port=" + strconv.Itoa(port),
			"-c", "unix_socket_directories=" + dir, "-c", "max_connections=100",
			"-c", "shared_buffers=16MB", "-c", "fsync=off", "-c", "synchronous_commit=off",
			"-c", "full_page_writes=off", "-c", "logging_collector=off", "-c", "log_min_messages=warning"}, extra...)...))
	}
	isready := filepath.Join(bin, "pg_isready")
	s.ready = func(ctx context.Context, s *Server) error {
		out, err := exec.CommandContext(ctx, isready, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "locker", "-d", "postgres").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pg_isready: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return newServer(t, s)
}

// mariaDBInit makes the private MariaDB's database and user at every start,
// as scripts/services.sh does for its "mariadb" instance: all privileges on
// locker.* only, nothing granted beyond loopback.
const mariaDBInit = `DELETE FROM mysql.proxies_priv WHERE Host <> 'localhost';
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS locker;
CREATE USER IF NOT EXISTS 'locker'@'127.0.0.1', 'locker'@'localhost';
ALTER USER 'locker'@'127.0.0.1' IDENTIFIED BY 'locker-private', 'locker'@'localhost' IDENTIFIED BY 'locker-private';
GRANT ALL PRIVILEGES ON locker.* TO 'locker'@'127.0.0.1', 'locker'@'localhost';
`

// mariaDBBin is the path of a MariaDB program: mariadbd is in /usr/sbin,
// which PATH may lack.
func mariaDBBin(t testing.TB, name string) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/" + name, "/usr/bin/" + name} {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return needBinary(t, name)
}

// StartMariaDB starts a private MariaDB, set up as the "mariadb" instance of
// scripts/services.sh (loopback, skip-name-resolve, utf8mb4, 32 MB buffer
// pool, no fsync but every commit written before it is acknowledged, so a
// killed server keeps it), and sets URL to mysql://locker:PASSWORD@ADDR/locker:
// user locker has every privilege on database locker and none elsewhere.
func StartMariaDB(t testing.TB) *Server {
	t.Helper()
	bin := mariaDBBin(t, "mariadbd")
	install := mariaDBBin(t, "mariadb-install-db")
	port := FreePorts(t, 1)[0]
	// Not t.TempDir: the unix socket's path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "locker-maria-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	files := filepath.Join(dir, "files")
	if err := os.Mkdir(files, 0o700); err != nil {
		t.Fatal(err)
	}
	initFile := filepath.Join(dir, "init.sql")
	if err := os.WriteFile(initFile, []byte(mariaDBInit), 0o600); err != nil {
		t.Fatal(err)
	}
	// --no-defaults (first): neither /etc/mysql nor ~/.my.cnf is read.
	opts := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"}
	if os.Geteuid() == 0 {
		opts = append(opts, "--user=root") // mariadbd refuses root otherwise
	}
	installCmd := exec.Command(install, append(opts, "--skip-test-db", "--auth-root-authentication-method=socket")...)
	installCmd.Dir = dir
	if out, err := installCmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: mariadb-install-db: %v\n%s", err, out)
	}
	s := &Server{
		Kind: "mariadb", Name: "mariadb-" + strconv.Itoa(port), Addr: loopback(port), dir: dir,
		URL:     fmt.Sprintf("mysql://locker:locker-private@127.0.0.1:%d/locker", port),
		startIn: 30 * time.Second,
	}
	s.command = func() *exec.Cmd {
		return exec.Command(bin, append(opts, "--port="+strconv.Itoa(port), "--bind-address=127.0.0.1",
			"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "mariadbd.pid"),
			"--init-file="+initFile, "--skip-name-resolve", "--secure-file-priv="+files, "--local-infile=0",
			"--character-set-server=utf8mb4", "--max-connections=300", "--performance-schema=OFF",
			"--key-buffer-size=1M", "--aria-pagecache-buffer-size=8M",
			"--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
			"--innodb-buffer-pool-dump-at-shutdown=0", "--innodb-buffer-pool-load-at-startup=0")...)
	}
	s.ready = mariaDBGreeting
	return newServer(t, s)
}

// mariaDBGreeting reads the server's handshake packet: protocol version 10
// once it accepts clients (its init file has run by then), an error packet
// (0xff, code, message) when it refuses them.
func mariaDBGreeting(ctx context.Context, s *Server) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var hdr [4]byte // 3-byte length, sequence number
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	n := min(int(hdr[0])|int(hdr[1])<<8|int(hdr[2])<<16, 1024)
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	switch {
	case n > 0 && body[0] == 10:
		return nil
	case n > 3 && body[0] == 0xff:
		return fmt.Errorf("refused: %s", body[3:])
	}
	return fmt.Errorf("handshake: unexpected packet %q", body)
}

// etcdHealthy asks a member's /health: true only with a leader.
func etcdHealthy(ctx context.Context, s *Server) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.Addr+"/health", nil)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b [256]byte
	n, _ := resp.Body.Read(b[:])
	if !strings.Contains(string(b[:n]), `"health":"true"`) {
		return fmt.Errorf("/health: %s", b[:n])
	}
	return nil
}

// StartEtcd starts a private single-member etcd (default heartbeat and
// election timeout, so leases are at least 2 s, as on the shared one).
func StartEtcd(t testing.TB) *Server {
	t.Helper()
	return StartEtcdCluster(t, 1)[0]
}

// StartEtcdCluster starts n etcd members forming one cluster. A member
// that is restarted rejoins with its data directory.
func StartEtcdCluster(t testing.TB, n int) []*Server {
	t.Helper()
	bin := needBinary(t, "etcd")
	ps := FreePorts(t, 2*n)
	token := fmt.Sprintf("locker-private-%d", ps[0])
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i+1, ps[n+i]))
	}
	members := make([]*Server, n)
	for i := range members {
		client, peer := ps[i], ps[n+i]
		s := &Server{Kind: "etcd", Name: fmt.Sprintf("etcd-%d", i+1), Addr: loopback(client), Ports: []int{peer}, dir: t.TempDir(), startIn: 30 * time.Second}
		name := fmt.Sprintf("m%d", i+1)
		s.command = func() *exec.Cmd {
			return exec.Command(bin, "--name", name, "--data-dir", filepath.Join(s.dir, "data"),
				"--listen-client-urls", "http://"+s.Addr, "--advertise-client-urls", "http://"+s.Addr,
				"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
				"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", token,
				"--initial-cluster-state", "new", "--logger", "zap", "--log-outputs", "stderr")
		}
		s.ready = etcdHealthy
		members[i] = s
	}
	return startGroup(t, members)
}

// zkClasspath is ZooKeeper's classpath from the Debian packages.
func zkClasspath(t testing.TB) string {
	t.Helper()
	j := "/usr/share/java"
	if _, err := os.Stat(filepath.Join(j, "zookeeper.jar")); err != nil {
		needBinary(t, filepath.Join(j, "zookeeper.jar"))
	}
	cp := filepath.Join(j, "zookeeper.jar")
	if _, err := os.Stat(filepath.Join(j, "slf4j-log4j12.jar")); err == nil {
		cp += ":" + filepath.Join(j, "slf4j-log4j12.jar") + ":" + filepath.Join(j, "log4j-1.2.jar")
	} else if _, err := os.Stat(filepath.Join(j, "slf4j-simple.jar")); err == nil {
		cp += ":" + filepath.Join(j, "slf4j-simple.jar")
	}
	return cp
}

// StartZK starts a private standalone ZooKeeper (tickTime 500 ms, session
// timeouts clamped into [1 s, 60 s], as the shared one).
func StartZK(t testing.TB) *Server {
	t.Helper()
	return StartZKEnsemble(t, 1)[0]
}

// StartZKEnsemble starts n ZooKeeper servers; n > 1 forms an ensemble
// (quorum and election ports in Ports). Each answers "Mode:" once it is in
// a quorum.
func StartZKEnsemble(t testing.TB, n int) []*Server {
	t.Helper()
	java := needBinary(t, "java")
	cp := zkClasspath(t)
	ps := FreePorts(t, 3*n)
	members := make([]*Server, n)
	for i := range members {
		client := ps[i]
		s := &Server{Kind: "zookeeper", Name: fmt.Sprintf("zk-%d", i+1), Addr: loopback(client), dir: t.TempDir(), startIn: 60 * time.Second}
		data := filepath.Join(s.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf("tickTime=500\ninitLimit=20\nsyncLimit=10\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n"+
			"dataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=*\n", data, client)
		if n > 1 {
			s.Ports = []int{ps[n+i], ps[2*n+i]}
			if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for j := 0; j < n; j++ {
				cfg += fmt.Sprintf("server.%d=127.0.0.1:%d:%d\n", j+1, ps[n+j], ps[2*n+j])
			}
		}
		conf := filepath.Join(s.dir, "zoo.cfg")
		log4j := filepath.Join(s.dir, "log4j.properties")
		if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(log4j, []byte("log4j.rootLogger=WARN, CONSOLE\n"+
			"log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"+
			"log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"+
			"log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} - %-5p [%t:%C{1}@%L] - %m%n\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		s.command = func() *exec.Cmd {
			return exec.Command(java, "-Xms32m", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
				"-Djava.net.preferIPv4Stack=true", "-Dzookeeper.forceSync=no",
				"-Dzookeeper.jmx.log4j.disable=true", "-Dlog4j.configuration=file:"+log4j,
				"-cp", cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf)
		}
		s.ready = func(ctx context.Context, s *Server) error { return exchange(ctx, s.Addr, "srvr", "Mode: ") }
		members[i] = s
	}
	return startGroup(t, members)
}

// startGroup starts every member before waiting for any (a cluster
// member answers only once a quorum runs), registers a Stop by PID at the
// end of the test, and fails the test if a member does not answer in time.
func startGroup(t testing.TB, members []*Server) []*Server {
	t.Helper()
	for _, s := range members {
		if s.startIn == 0 {
			s.startIn = 30 * time.Second
		}
		if s.stopSig == 0 {
			s.stopSig = syscall.SIGTERM
		}
		t.Cleanup(func() {
			if err := s.Stop(); err != nil {
				t.Errorf("testenv: %v", err)
			}
			s.mu.Lock()
			if s.logf != nil {
				s.logf.Close()
			}
			s.mu.Unlock()
		})
		if err := s.spawn(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	// One bound for the group: members become ready together.
	deadline := time.Now().Add(members[0].startIn)
	for _, s := range members {
		if err := s.waitReady(time.Until(deadline)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return members
}
