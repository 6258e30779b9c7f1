// Package servers tells where the servers started by scripts/services.sh
// listen. It reads only the environment and does not import testing, so
// commands (lockctl bench) can use it; internal/testenv builds the test-side
// helpers (Require, Stop, Start, private servers) on top of it.
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
//	LOCKER_MYSQL_URL               mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker (MariaDB)
//	LOCKER_ETCD_ENDPOINTS          127.0.0.1:2379
//	LOCKER_ETCD_CLUSTER_ENDPOINTS  127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793
//	LOCKER_ZK_ADDR                 127.0.0.1:2181
//	LOCKER_ZK_ENSEMBLE             127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184
package servers

import (
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
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
	EnvMySQLURL             = "LOCKER_MYSQL_URL"
	EnvEtcdEndpoints        = "LOCKER_ETCD_ENDPOINTS"
	EnvEtcdClusterEndpoints = "LOCKER_ETCD_CLUSTER_ENDPOINTS"
	EnvZKAddr               = "LOCKER_ZK_ADDR"
	EnvZKEnsemble           = "LOCKER_ZK_ENSEMBLE"

	// EnvRequireServers set to 1 makes testenv.Require fail instead of skip, as CI does.
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
	DefaultMySQLURL             = "mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker" // a throw-away password: loopback only
	DefaultEtcdEndpoints        = "127.0.0.1:2379"
	DefaultEtcdClusterEndpoints = "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793"
	DefaultZKAddr               = "127.0.0.1:2181"
	DefaultZKEnsemble           = "127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184"
)

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
func PostgresAddr() string { return urlAddr(PostgresURL(), "5432") }

// urlAddr is the host:port of a URL, with the default port when it has none
// (and 127.0.0.1 when it has no host).
func urlAddr(raw, port string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), port)
	}
	return u.Host
}

// MySQLURL is the connection URL of the MariaDB database (instance "mariadb"),
// mysql://user:password@host:port/db: the user has every privilege on that
// database and none elsewhere.
func MySQLURL() string { return env(EnvMySQLURL, DefaultMySQLURL) }

// MySQLAddr is the host:port of MySQLURL, for Require.
func MySQLAddr() string { return urlAddr(MySQLURL(), "3306") }

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
	add("mariadb", "mariadb", MySQLAddr())
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
	add("mariadb-tls", "mariadb (TLS required)", MySQLTLSAddr())
	add("etcd-tls", "etcd (TLS, RBAC)", EtcdTLSEndpoint())
	add("zk-tls", "zookeeper (TLS)", ZKTLSAddr())
	return out
}

// HostPort strips a URL scheme and path from an endpoint: "http://h:1/x" -> "h:1".
func HostPort(addr string) string {
	if i := strings.Index(addr, "://"); i >= 0 {
		addr = addr[i+3:]
	}
	if i := strings.IndexByte(addr, '/'); i >= 0 {
		addr = addr[:i]
	}
	return addr
}

// The secured instances started by scripts/services.sh (group "secure"): TLS
// with a throw-away CA the script makes, and authentication. Their
// administrator authenticates with AdminPassword (or, for etcd, the admin
// certificate, CN=root).
const (
	EnvRedisTLSAddr    = "LOCKER_REDIS_TLS_ADDR"
	EnvPostgresTLSAddr = "LOCKER_POSTGRES_TLS_ADDR"
	EnvMySQLTLSAddr    = "LOCKER_MYSQL_TLS_ADDR"
	EnvEtcdTLSEndpoint = "LOCKER_ETCD_TLS_ENDPOINT"
	EnvZKTLSAddr       = "LOCKER_ZK_TLS_ADDR"
	EnvSecureCerts     = "LOCKER_SECURE_CERTS"
	EnvAdminPassword   = "LOCKER_SECURE_ADMIN_PASSWORD"

	DefaultRedisTLSAddr    = "127.0.0.1:6390"
	DefaultPostgresTLSAddr = "127.0.0.1:5433"
	DefaultMySQLTLSAddr    = "127.0.0.1:3307"
	DefaultEtcdTLSEndpoint = "127.0.0.1:2390"
	DefaultZKTLSAddr       = "127.0.0.1:2190"
	DefaultAdminPassword   = "locker-admin-secret"
)

// RedisTLSAddr is the TLS port of the secured Redis (instance "redis-tls").
func RedisTLSAddr() string { return env(EnvRedisTLSAddr, DefaultRedisTLSAddr) }

// PostgresTLSAddr is the secured PostgreSQL (instance "postgres-tls").
func PostgresTLSAddr() string { return env(EnvPostgresTLSAddr, DefaultPostgresTLSAddr) }

// MySQLTLSAddr is the secured MariaDB (instance "mariadb-tls"): TLS required
// for every TCP client, administrator admin, database locker.
func MySQLTLSAddr() string { return env(EnvMySQLTLSAddr, DefaultMySQLTLSAddr) }

// EtcdTLSEndpoint is the secured etcd's client endpoint (instance "etcd-tls").
func EtcdTLSEndpoint() string { return env(EnvEtcdTLSEndpoint, DefaultEtcdTLSEndpoint) }

// ZKTLSAddr is the TLS client port of the secured ZooKeeper (instance "zk-tls").
func ZKTLSAddr() string { return env(EnvZKTLSAddr, DefaultZKTLSAddr) }

// AdminPassword is the secured instances' administrator password.
func AdminPassword() string { return env(EnvAdminPassword, DefaultAdminPassword) }
