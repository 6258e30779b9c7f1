package servers

import (
	"slices"
	"testing"
)

var allEnv = []string{
	EnvRedisAddr, EnvRedisQuorumAddrs, EnvRedisClusterAddrs, EnvMemcacheAddr, EnvMemcacheSmallAddr, EnvPostgresURL, EnvMySQLURL,
	EnvEtcdEndpoints, EnvEtcdClusterEndpoints, EnvZKAddr, EnvZKEnsemble, EnvRedisTLSAddr, EnvPostgresTLSAddr, EnvMySQLTLSAddr, EnvEtcdTLSEndpoint, EnvZKTLSAddr,
}

// clearEnv blanks every address variable for the test (blank means unset here).
func clearEnv(t *testing.T) {
	for _, k := range allEnv {
		t.Setenv(k, "")
	}
}

func TestDefaults(t *testing.T) {
	clearEnv(t)
	checkString(t, "RedisAddr", RedisAddr(), "127.0.0.1:6379")
	checkList(t, "RedisQuorumAddrs", RedisQuorumAddrs(),
		"127.0.0.1:6381", "127.0.0.1:6382", "127.0.0.1:6383", "127.0.0.1:6384", "127.0.0.1:6385")
	checkList(t, "RedisClusterAddrs", RedisClusterAddrs(), "127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")
	checkString(t, "MemcacheAddr", MemcacheAddr(), "127.0.0.1:11211")
	checkString(t, "MemcacheSmallAddr", MemcacheSmallAddr(), "127.0.0.1:11212")
	checkString(t, "PostgresURL", PostgresURL(), "postgres://locker@127.0.0.1:5432/locker?sslmode=disable")
	checkString(t, "PostgresAddr", PostgresAddr(), "127.0.0.1:5432")
	checkString(t, "MySQLURL", MySQLURL(), "mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker")
	checkString(t, "MySQLAddr", MySQLAddr(), "127.0.0.1:3306")
	checkString(t, "MySQLTLSAddr", MySQLTLSAddr(), "127.0.0.1:3307")
	checkList(t, "EtcdEndpoints", EtcdEndpoints(), "127.0.0.1:2379")
	checkList(t, "EtcdClusterEndpoints", EtcdClusterEndpoints(), "127.0.0.1:23791", "127.0.0.1:23792", "127.0.0.1:23793")
	checkList(t, "ZKAddrs", ZKAddrs(), "127.0.0.1:2181")
	checkList(t, "ZKEnsemble", ZKEnsemble(), "127.0.0.1:2182", "127.0.0.1:2183", "127.0.0.1:2184")
}

func TestOverrides(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvRedisAddr, " 10.0.0.1:7000 ")
	t.Setenv(EnvRedisQuorumAddrs, "a:1, b:2 ,,c:3,")
	t.Setenv(EnvRedisClusterAddrs, " k1:1,k2:2 ")
	t.Setenv(EnvMemcacheAddr, "m:1")
	t.Setenv(EnvMemcacheSmallAddr, "m:2")
	t.Setenv(EnvPostgresURL, "postgres://u:p@db.example:6543/x?sslmode=disable")
	t.Setenv(EnvMySQLURL, "mysql://u:p@db.example:3316/x?tls=true")
	t.Setenv(EnvMySQLTLSAddr, "db.example:3317")
	t.Setenv(EnvEtcdEndpoints, "http://e1:2379,http://e2:2379")
	t.Setenv(EnvEtcdClusterEndpoints, "c1:1")
	t.Setenv(EnvZKAddr, "z:1")
	t.Setenv(EnvZKEnsemble, "z1:1,z2:2")

	checkString(t, "RedisAddr", RedisAddr(), "10.0.0.1:7000")
	checkList(t, "RedisQuorumAddrs", RedisQuorumAddrs(), "a:1", "b:2", "c:3")
	checkList(t, "RedisClusterAddrs", RedisClusterAddrs(), "k1:1", "k2:2")
	checkString(t, "MemcacheAddr", MemcacheAddr(), "m:1")
	checkString(t, "MemcacheSmallAddr", MemcacheSmallAddr(), "m:2")
	checkString(t, "PostgresURL", PostgresURL(), "postgres://u:p@db.example:6543/x?sslmode=disable")
	checkString(t, "PostgresAddr", PostgresAddr(), "db.example:6543")
	checkString(t, "MySQLURL", MySQLURL(), "mysql://u:p@db.example:3316/x?tls=true")
	checkString(t, "MySQLAddr", MySQLAddr(), "db.example:3316")
	checkString(t, "MySQLTLSAddr", MySQLTLSAddr(), "db.example:3317")
	checkList(t, "EtcdEndpoints", EtcdEndpoints(), "http://e1:2379", "http://e2:2379")
	checkList(t, "EtcdClusterEndpoints", EtcdClusterEndpoints(), "c1:1")
	checkList(t, "ZKAddrs", ZKAddrs(), "z:1")
	checkList(t, "ZKEnsemble", ZKEnsemble(), "z1:1", "z2:2")
}

func TestPostgresAddr(t *testing.T) {
	for url, want := range map[string]string{
		"postgres://locker@127.0.0.1:5432/locker?sslmode=disable": "127.0.0.1:5432",
		"postgresql://h/db":                 "h:5432",
		"postgres://u@[::1]:5433/db":        "[::1]:5433",
		"postgres://u@localhost:15432/db?x": "localhost:15432",
	} {
		t.Setenv(EnvPostgresURL, url)
		checkString(t, url, PostgresAddr(), want)
	}
}

func TestMySQLAddr(t *testing.T) {
	for url, want := range map[string]string{
		"mysql://locker:pw@127.0.0.1:3306/locker": "127.0.0.1:3306",
		"mysql://u:pw@h/db":                       "h:3306",
		"mysql://u@[::1]:3307/db?tls=true":        "[::1]:3307",
		"mysql:///db":                             "127.0.0.1:3306",
	} {
		t.Setenv(EnvMySQLURL, url)
		checkString(t, url, MySQLAddr(), want)
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:2379":          "127.0.0.1:2379",
		"http://127.0.0.1:2379":   "127.0.0.1:2379",
		"https://h:1/v3/":         "h:1",
		"unix:///tmp/sock":        "",
		"redis://127.0.0.1:6379/": "127.0.0.1:6379",
	} {
		checkString(t, in, HostPort(in), want)
	}
}

// The instance names must be the ones scripts/services.sh knows.
func TestInstances(t *testing.T) {
	clearEnv(t)
	var names []string
	for _, in := range Instances() {
		names = append(names, in.Name)
	}
	want := []string{"redis", "redis-q1", "redis-q2", "redis-q3", "redis-q4", "redis-q5",
		"redis-c1", "redis-c2", "redis-c3",
		"memcached", "memcached-small", "redis-restart", "memcached-restart", "postgres", "mariadb", "etcd", "etcd-c1", "etcd-c2", "etcd-c3",
		"zk", "zk-e1", "zk-e2", "zk-e3", "redis-tls", "postgres-tls", "mariadb-tls", "etcd-tls", "zk-tls"}
	if !slices.Equal(names, want) {
		t.Errorf("Instances() names = %v, want %v", names, want)
	}
}

func checkString(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func checkList(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}
