#!/usr/bin/env bash
# scripts/services.sh - run the real servers the integration tests talk to.
#
# Usage:
#   scripts/services.sh up [NAME|GROUP...]   install what is missing, start (default: everything),
#                                            wait until it answers, print `export` lines on stdout
#   scripts/services.sh down                 stop every instance this script started (pid files)
#   scripts/services.sh status [NAME...]     print each instance with up/down (exit 3 if any is down)
#   scripts/services.sh start NAME...        start (restart) single instances, reusing their data dir
#   scripts/services.sh stop NAME...         stop single instances (SIGTERM, SIGKILL after 30 s)
#   scripts/services.sh env                  print the `export` lines only
#   scripts/services.sh logs NAME            print the tail of an instance's log
#   scripts/services.sh clean                `down`, then delete every instance's data dir
#
# `eval "$(scripts/services.sh up)"` works: progress goes to stderr, the exports to stdout.
#
# Instances (the address comes from the env var; only its port is used, every server binds
# 127.0.0.1 and nothing else):
#   redis                 LOCKER_REDIS_ADDR             127.0.0.1:6379
#   redis-q1..redis-q5    LOCKER_REDIS_QUORUM_ADDRS     127.0.0.1:6381,...,127.0.0.1:6385
#   redis-c1..redis-c3    LOCKER_REDIS_CLUSTER_ADDRS    127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
#                         (a 3-master Redis Cluster, no replicas; cluster bus on port+10000:
#                          17101..17103)
#   memcached             LOCKER_MEMCACHE_ADDR          127.0.0.1:11211
#   memcached-small       LOCKER_MEMCACHE_SMALL_ADDR    127.0.0.1:11212   (-m 2: 2 MB, evicts)
#   redis-restart         LOCKER_REDIS_RESTART_ADDR     127.0.0.1:6386    (only for tests that restart it)
#   memcached-restart     LOCKER_MEMCACHE_RESTART_ADDR  127.0.0.1:11213   (only for tests that restart it)
#   `go test ./...` runs packages in parallel, so a test that stops a server uses an
#   instance that no other package uses: the quorum members, the clusters, the *-restart ones.
#   postgres              LOCKER_POSTGRES_URL           postgres://locker@127.0.0.1:5432/locker?sslmode=disable
#   mariadb               LOCKER_MYSQL_URL              mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker
#                         (user locker@127.0.0.1 and @localhost, all privileges on locker.* only;
#                          the password is a throw-away, loopback only)
#   etcd                  LOCKER_ETCD_ENDPOINTS         127.0.0.1:2379    (peer: LOCKER_ETCD_PEER_PORT=2380)
#   etcd-c1..etcd-c3      LOCKER_ETCD_CLUSTER_ENDPOINTS 127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793
#                         (peers: LOCKER_ETCD_CLUSTER_PEER_PORTS=23801,23802,23803)
#   zk                    LOCKER_ZK_ADDR                127.0.0.1:2181
#   zk-e1..zk-e3          LOCKER_ZK_ENSEMBLE            127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184
#                         (quorum ports LOCKER_ZK_QUORUM_PORTS=28881,28882,28883,
#                          election ports LOCKER_ZK_ELECTION_PORTS=28891,28892,28893;
#                          all below Linux's ephemeral range, 32768-60999: an
#                          election port there was once taken by some client's
#                          outgoing connection, and the member exited at start)
# Secured instances (security tests; TLS with a throw-away CA made by this script, see below):
#   redis-tls             LOCKER_REDIS_TLS_ADDR         127.0.0.1:6390
#                         (TLS port only, client certificates required; ACL: default user
#                          off, admin with every permission; tests add their own users)
#   postgres-tls          LOCKER_POSTGRES_TLS_ADDR      127.0.0.1:5433
#                         (own cluster; hostssl + scram-sha-256 only, plain TCP rejected; superuser
#                          admin, database locker; client certificates checked if sent, not required)
#   mariadb-tls           LOCKER_MYSQL_TLS_ADDR         127.0.0.1:3307
#                         (own data dir; require_secure_transport: TLS for every TCP user; admin
#                          (@127.0.0.1, @localhost) with all privileges WITH GRANT OPTION, database
#                          locker; client certificates checked if sent, not required)
#   etcd-tls              LOCKER_ETCD_TLS_ENDPOINT      127.0.0.1:2390    (peer: LOCKER_ETCD_TLS_PEER_PORT=2391)
#                         (one member, https only, client certificates required (--client-cert-auth);
#                          auth on: user root with the admin password, and the admin cert's CN=root)
#   zk-tls                LOCKER_ZK_TLS_ADDR            127.0.0.1:2190    (the TLS client port)
#                         (3.8 standalone, settings as zk; TLS only, no plain port: Netty, PEM
#                          keystore, client certificates required; super user admin, digest)
#   Certificates (PEM) in LOCKER_SECURE_CERTS (<services dir>/certs): ca.pem, server.pem and
#   server-key.pem (127.0.0.1, localhost), client.pem and client-key.pem (CN=locker),
#   admin.pem and admin-key.pem (CN=root). The administrator of every secured instance
#   authenticates with the password in LOCKER_SECURE_ADMIN_PASSWORD (throw-away, loopback only).
# Groups accepted by up/start/stop/status: all, redis-quorum, redis-cluster, etcd-cluster,
# zk-ensemble, secure.
#
# Other knobs: LOCKER_SERVICES_DIR (default <repo>/.services, git-ignored) holds one directory
# per instance (data/, server.log, pid); LOCKER_SERVICES_TIMEOUT (default 60) bounds the wait
# for readiness, in seconds.
#
# Server settings that tests depend on:
#   redis      no persistence (save "", appendonly no), maxmemory-policy noeviction,
#              enable-debug-command local (DEBUG SLEEP etc. work from 127.0.0.1).
#   redis-cluster  the same settings plus cluster-enabled yes, cluster-node-timeout 5000,
#              cluster-config-file data/nodes.conf. Ready means cluster_state:ok on all three
#              (status shows a member as down until then). `up` forms the cluster with
#              `redis-cli --cluster create ... --cluster-replicas 0` when it is not formed.
#              nodes.conf: a member started while no other member is in a formed cluster
#              (e.g. the whole group after `down`) starts without it (deleted) and the group
#              is created anew; a member started while the others still run a cluster keeps
#              it and rejoins with its node id and slots (stop/start of one member; after more
#              than 5 s down the others flagged it FAIL and clear that only 10 s after setting
#              it, so `start` may wait that long). When the
#              three disagree (e.g. one member's data dir was deleted), `up` empties all three
#              (FLUSHALL, CLUSTER RESET HARD) and creates the cluster again: nothing persists.
#   memcached  run as user memcache (or nobody) when started as root; UDP off.
#   postgres   own cluster (initdb), trust auth on 127.0.0.1, superuser role and database
#              from LOCKER_POSTGRES_URL (locker/locker), max_connections=300, fsync=off.
#              A Debian cluster on the same port (e.g. 15/main on 5432) is stopped and its
#              start.conf set to "manual".
#   mariadb    10.11 (Debian), private data dirs (mariadb-install-db once), --defaults-file
#              my.cnf in the instance dir (/etc/mysql is not read), unix socket in the instance
#              dir, skip-name-resolve, utf8mb4 (utf8mb4_general_ci, as Debian's config), 32 MB
#              buffer pool, performance_schema off, max_connections=300, no fsync
#              (innodb_flush_log_at_trx_commit=2: a commit survives a killed server, not a
#              crashed machine; no doublewrite), no binary log. Users,
#              grants and the database come from init.sql, run by the server at every start.
#              Debian's own mariadb.service is disabled when this script installs the package.
#   etcd       3.4 (Debian), default heartbeat 100 ms / election timeout 1000 ms, so the
#              server's minimum lease TTL is 2 s: a lease granted with a smaller TTL gets 2 s.
#              A stopped member that is started again rejoins with its data dir.
#   zookeeper  3.8 (Debian), tickTime=500 ms, minSessionTimeout=1000 ms,
#              maxSessionTimeout=60000 ms: the server clamps the session timeout a client asks
#              for into [1 s, 60 s]. initLimit=20 ticks (10 s), syncLimit=10 ticks (5 s).
#              admin server off, all four-letter words allowed, JVM -Xmx128m, forceSync=no.
#
# Needs bash, coreutils, util-linux (setpriv, flock) and Debian packages, which it installs
# with apt-get when a binary is missing (root, or sudo).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${LOCKER_SERVICES_DIR:-$ROOT/.services}
TIMEOUT=${LOCKER_SERVICES_TIMEOUT:-60}

: "${LOCKER_REDIS_ADDR:=127.0.0.1:6379}"
: "${LOCKER_REDIS_QUORUM_ADDRS:=127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383,127.0.0.1:6384,127.0.0.1:6385}"
: "${LOCKER_REDIS_CLUSTER_ADDRS:=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103}"
: "${LOCKER_MEMCACHE_ADDR:=127.0.0.1:11211}"
: "${LOCKER_MEMCACHE_SMALL_ADDR:=127.0.0.1:11212}"
: "${LOCKER_REDIS_RESTART_ADDR:=127.0.0.1:6386}"
: "${LOCKER_MEMCACHE_RESTART_ADDR:=127.0.0.1:11213}"
: "${LOCKER_POSTGRES_URL:=postgres://locker@127.0.0.1:5432/locker?sslmode=disable}"
: "${LOCKER_MYSQL_URL:=mysql://locker:locker-mysql-secret@127.0.0.1:3306/locker}"
: "${LOCKER_ETCD_ENDPOINTS:=127.0.0.1:2379}"
: "${LOCKER_ETCD_PEER_PORT:=2380}"
: "${LOCKER_ETCD_CLUSTER_ENDPOINTS:=127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793}"
: "${LOCKER_ETCD_CLUSTER_PEER_PORTS:=23801,23802,23803}"
: "${LOCKER_ZK_ADDR:=127.0.0.1:2181}"
: "${LOCKER_ZK_ENSEMBLE:=127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184}"
: "${LOCKER_ZK_QUORUM_PORTS:=28881,28882,28883}"
: "${LOCKER_ZK_ELECTION_PORTS:=28891,28892,28893}"
: "${LOCKER_REDIS_TLS_ADDR:=127.0.0.1:6390}"
: "${LOCKER_POSTGRES_TLS_ADDR:=127.0.0.1:5433}"
: "${LOCKER_MYSQL_TLS_ADDR:=127.0.0.1:3307}"
: "${LOCKER_ETCD_TLS_ENDPOINT:=127.0.0.1:2390}"
: "${LOCKER_ETCD_TLS_PEER_PORT:=2391}"
: "${LOCKER_ZK_TLS_ADDR:=127.0.0.1:2190}"
# The secured instances' administrator password: a throw-away for servers bound to loopback.
LOCKER_SECURE_ADMIN_PASSWORD=locker-admin-secret

ALL=(redis redis-q1 redis-q2 redis-q3 redis-q4 redis-q5 redis-c1 redis-c2 redis-c3 redis-restart memcached memcached-small memcached-restart postgres
	mariadb etcd etcd-c1 etcd-c2 etcd-c3 zk zk-e1 zk-e2 zk-e3 postgres-tls mariadb-tls zk-tls redis-tls etcd-tls)
CLUSTER=(redis-c1 redis-c2 redis-c3)
# Secured instances. One joins ALL once it is built.
SECURE=(redis-tls postgres-tls mariadb-tls etcd-tls zk-tls)

log() { printf '%s\n' "services: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# ---------------------------------------------------------------- names, ports

# nth LIST N: the N-th (1-based) element of a comma-separated list, without spaces.
nth() {
	local IFS=, i=0 x
	for x in $1; do
		x=${x//[[:space:]]/}
		[[ -z $x ]] && continue
		i=$((i + 1))
		if ((i == $2)); then
			printf '%s\n' "$x"
			return 0
		fi
	done
	return 1
}

# port_of ADDR: the port of host:port, [v6]:port or scheme://host:port.
port_of() {
	local a=${1#*://}
	a=${a%%/*}
	a=${a##*:}
	[[ $a =~ ^[0-9]+$ ]] || return 1
	printf '%s\n' "$a"
}

# Parts of LOCKER_POSTGRES_URL: user, port, database.
pg_url_part() {
	local u=${LOCKER_POSTGRES_URL#*://} user port db hostport
	u=${u%%\?*}
	user=locker
	if [[ $u == *@* ]]; then
		user=${u%%@*}
		user=${user%%:*}
		u=${u#*@}
	fi
	hostport=${u%%/*}
	db=locker
	[[ $u == */* && -n ${u#*/} ]] && db=${u#*/}
	port=5432
	[[ $hostport =~ :([0-9]+)$ ]] && port=${BASH_REMATCH[1]}
	case $1 in
	user) printf '%s\n' "$user" ;;
	port) printf '%s\n' "$port" ;;
	db) printf '%s\n' "$db" ;;
	esac
}

# Parts of LOCKER_MYSQL_URL (mysql://user:password@host:port/db?params): user, password, port,
# db. They go into SQL and option files unquoted, so only [A-Za-z0-9_.-] is accepted.
my_url_part() {
	local u=${LOCKER_MYSQL_URL#mysql://} cred hostport db v
	u=${u%%\?*}
	[[ $u == *@*/* ]] || die "LOCKER_MYSQL_URL is not of the form mysql://user:password@host:port/db"
	cred=${u%%@*}
	u=${u#*@}
	hostport=${u%%/*}
	db=${u#*/}
	case $1 in
	user) v=${cred%%:*} ;;
	password) v=${cred#*:} ;;
	db) v=$db ;;
	port)
		v=3306
		[[ $hostport =~ :([0-9]+)$ ]] && v=${BASH_REMATCH[1]}
		;;
	esac
	[[ $v =~ ^[A-Za-z0-9_.-]+$ ]] || die "LOCKER_MYSQL_URL: the $1 is empty or has characters other than [A-Za-z0-9_.-]"
	printf '%s\n' "$v"
}

kind() {
	case $1 in
	redis | redis-q[1-5] | redis-c[1-3] | redis-restart) echo redis ;;
	memcached | memcached-small | memcached-restart) echo memcached ;;
	postgres) echo postgres ;;
	mariadb) echo mariadb ;;
	etcd | etcd-c[1-3]) echo etcd ;;
	zk | zk-e[1-3]) echo zk ;;
	redis-tls | postgres-tls | mariadb-tls | etcd-tls | zk-tls) echo "$1" ;;
	*) return 1 ;;
	esac
}

# index of a numbered member: redis-q3 -> 3.
idx() { printf '%s\n' "${1##*[!0-9]}"; }

port() {
	local p=""
	case $1 in
	redis) p=$(port_of "$LOCKER_REDIS_ADDR") || p="" ;;
	redis-q*) p=$(port_of "$(nth "$LOCKER_REDIS_QUORUM_ADDRS" "$(idx "$1")")") || p="" ;;
	redis-c*) p=$(port_of "$(nth "$LOCKER_REDIS_CLUSTER_ADDRS" "$(idx "$1")")") || p="" ;;
	redis-restart) p=$(port_of "$LOCKER_REDIS_RESTART_ADDR") || p="" ;;
	memcached-restart) p=$(port_of "$LOCKER_MEMCACHE_RESTART_ADDR") || p="" ;;
	memcached) p=$(port_of "$LOCKER_MEMCACHE_ADDR") || p="" ;;
	memcached-small) p=$(port_of "$LOCKER_MEMCACHE_SMALL_ADDR") || p="" ;;
	postgres) p=$(pg_url_part port) || p="" ;;
	mariadb) p=$(my_url_part port) || p="" ;;
	etcd) p=$(port_of "$(nth "$LOCKER_ETCD_ENDPOINTS" 1)") || p="" ;;
	etcd-c*) p=$(port_of "$(nth "$LOCKER_ETCD_CLUSTER_ENDPOINTS" "$(idx "$1")")") || p="" ;;
	zk) p=$(port_of "$(nth "$LOCKER_ZK_ADDR" 1)") || p="" ;;
	zk-e*) p=$(port_of "$(nth "$LOCKER_ZK_ENSEMBLE" "$(idx "$1")")") || p="" ;;
	redis-tls) p=$(port_of "$LOCKER_REDIS_TLS_ADDR") || p="" ;;
	postgres-tls) p=$(port_of "$LOCKER_POSTGRES_TLS_ADDR") || p="" ;;
	mariadb-tls) p=$(port_of "$LOCKER_MYSQL_TLS_ADDR") || p="" ;;
	etcd-tls) p=$(port_of "$LOCKER_ETCD_TLS_ENDPOINT") || p="" ;;
	zk-tls) p=$(port_of "$LOCKER_ZK_TLS_ADDR") || p="" ;;
	esac
	[[ -n $p ]] || die "$1: no port (check the LOCKER_* variable for it)"
	printf '%s\n' "$p"
}

etcd_peer_port() {
	case $1 in
	etcd) printf '%s\n' "$LOCKER_ETCD_PEER_PORT" ;;
	etcd-c*) nth "$LOCKER_ETCD_CLUSTER_PEER_PORTS" "$(idx "$1")" || die "$1: no peer port in LOCKER_ETCD_CLUSTER_PEER_PORTS" ;;
	etcd-tls) printf '%s\n' "$LOCKER_ETCD_TLS_PEER_PORT" ;;
	esac
}

# expand NAMES...: validated instance names, groups expanded, duplicates dropped.
expand() {
	local n out=() seen=" "
	for n in "$@"; do
		case $n in
		all) set -- "${ALL[@]}" ;;
		redis-quorum) set -- redis-q1 redis-q2 redis-q3 redis-q4 redis-q5 ;;
		redis-cluster) set -- "${CLUSTER[@]}" ;;
		etcd-cluster) set -- etcd-c1 etcd-c2 etcd-c3 ;;
		zk-ensemble) set -- zk-e1 zk-e2 zk-e3 ;;
		secure) set -- "${SECURE[@]}" ;;
		*)
			kind "$n" >/dev/null || die "unknown instance '$n' (known: ${ALL[*]} ${SECURE[*]} all redis-quorum redis-cluster etcd-cluster zk-ensemble secure)"
			set -- "$n"
			;;
		esac
		local m
		for m in "$@"; do
			[[ $seen == *" $m "* ]] && continue
			seen+="$m "
			out+=("$m")
		done
	done
	printf '%s\n' "${out[@]}"
}

idir() { printf '%s\n' "$DIR/$1"; }

# ---------------------------------------------------------------- install

pg_bin() {
	local d dirs=(/usr/lib/postgresql/*/bin)
	for d in /usr/lib/postgresql/15/bin $(printf '%s\n' "${dirs[@]}" | sort -V -r); do
		if [[ -x $d/postgres && -x $d/initdb && -x $d/pg_isready && -x $d/psql ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	done
	return 1
}

# my_bin NAME: the path of a MariaDB program (mariadbd is in /usr/sbin, which a user's PATH may lack).
my_bin() {
	local p
	for p in "$(command -v "$1")" "/usr/sbin/$1" "/usr/bin/$1"; do
		[[ -n $p && -x $p ]] && printf '%s\n' "$p" && return 0
	done
	return 1
}

zk_classpath() {
	local j=/usr/share/java cp
	[[ -r $j/zookeeper.jar ]] || return 1
	cp=$j/zookeeper.jar
	if [[ -r $j/slf4j-log4j12.jar && -r $j/log4j-1.2.jar ]]; then
		cp+=:$j/slf4j-log4j12.jar:$j/log4j-1.2.jar
	elif [[ -r $j/slf4j-simple.jar ]]; then
		cp+=:$j/slf4j-simple.jar
	fi
	printf '%s\n' "$cp"
}

# missing_packages KIND...: Debian packages to install for these kinds.
missing_packages() {
	local k pkgs=()
	for k in "$@"; do
		if [[ $k == *-tls ]]; then
			command -v openssl >/dev/null || pkgs+=(openssl)
			k=${k%-tls}
		fi
		case $k in
		redis)
			command -v redis-server >/dev/null || pkgs+=(redis-server)
			command -v redis-cli >/dev/null || pkgs+=(redis-tools)
			;;
		memcached) command -v memcached >/dev/null || pkgs+=(memcached) ;;
		postgres) pg_bin >/dev/null || pkgs+=(postgresql) ;;
		mariadb)
			# mariadb-server, not only -core: its plugins (auth_ed25519, metadata_lock_info)
			# are in it. Its daemon is kept off (policy-rc.d, then mariadb_keep_debian_off).
			[[ -x $(my_bin mariadbd) && -x $(my_bin mariadb-install-db) ]] || pkgs+=(mariadb-server)
			command -v mariadb >/dev/null || pkgs+=(mariadb-client)
			;;
		etcd)
			command -v etcd >/dev/null || pkgs+=(etcd-server)
			command -v etcdctl >/dev/null || pkgs+=(etcd-client)
			;;
		zk)
			zk_classpath >/dev/null || pkgs+=(zookeeper)
			command -v java >/dev/null || pkgs+=(default-jre-headless)
			;;
		esac
	done
	[[ ${#pkgs[@]} -gt 0 ]] && printf '%s\n' "${pkgs[@]}" | sort -u
	return 0
}

POLICY_RC=/usr/sbin/policy-rc.d
OUR_POLICY_RC=
remove_policy_rc() {
	if [[ -n $OUR_POLICY_RC ]] && [[ -f $POLICY_RC ]] && grep -q 'locker services.sh' "$POLICY_RC"; then
		if [[ $EUID -eq 0 ]]; then rm -f "$POLICY_RC"; else sudo rm -f "$POLICY_RC"; fi
	fi
	OUR_POLICY_RC=
}

# mariadb_keep_debian_off [SUDO]: installing mariadb-server enables Debian's mariadb.service
# (policy-rc.d only kept it from starting then); on a systemd host it would take 3306 at the
# next boot.
mariadb_keep_debian_off() {
	[[ -d /run/systemd/system ]] || return 0
	log "mariadb: disabling Debian's mariadb.service (it would take port 3306)"
	"$@" systemctl disable --now mariadb.service >/dev/null 2>&1 || log "mariadb: could not disable mariadb.service"
}

install_kinds() {
	local pkgs sudo=()
	mapfile -t pkgs < <(missing_packages "$@")
	[[ ${#pkgs[@]} -eq 0 ]] && return 0
	if [[ $EUID -ne 0 ]]; then
		command -v sudo >/dev/null || die "missing packages ${pkgs[*]}: run as root or install them"
		sudo=(sudo)
	fi
	log "installing ${pkgs[*]} (apt-get)"
	# The packages' maintainer scripts would start their own daemons on our ports (redis on
	# 6379, a postgres cluster on 5432, ...). A policy-rc.d that says 101 stops invoke-rc.d.
	if [[ ! -e $POLICY_RC ]]; then
		"${sudo[@]}" sh -c "printf '#!/bin/sh\n# locker services.sh: no daemon starts during apt-get\nexit 101\n' >$POLICY_RC && chmod 755 $POLICY_RC"
		OUR_POLICY_RC=1
		trap remove_policy_rc EXIT
	fi
	local rc=0
	{
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
			"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
	} >"$DIR/apt.log" 2>&1 || rc=$?
	[[ -n $OUR_POLICY_RC ]] && "${sudo[@]}" rm -f "$POLICY_RC" && OUR_POLICY_RC=
	if ((rc != 0)); then
		tail -n 30 "$DIR/apt.log" >&2
		die "apt-get failed (full log: $DIR/apt.log)"
	fi
	[[ " ${pkgs[*]} " == *" mariadb-server "* ]] && mariadb_keep_debian_off "${sudo[@]}"
	local k
	for k in "$@"; do
		[[ -n $(missing_packages "$k") ]] && die "still missing after apt-get: $(missing_packages "$k" | tr '\n' ' ')"
	done
	return 0
}

# ---------------------------------------------------------------- processes

pid_of() {
	local f
	f=$(idir "$1")/pid
	[[ -r $f ]] || return 1
	local p
	p=$(<"$f")
	[[ $p =~ ^[0-9]+$ ]] || return 1
	printf '%s\n' "$p"
}

# alive PID: the process exists and is not a zombie (an exited server waits for its
# reaper, which may be a slow PID 1).
alive() {
	local stat st
	# A stale pid file names a process that is gone: not alive, not an error.
	[[ -r /proc/$1/stat ]] || return 1
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	st=${stat##*) }
	st=${st%% *}
	[[ -n $st && $st != Z && $st != X ]]
}

# running NAME: its recorded process is alive and is the right program.
running() {
	local p cmd
	p=$(pid_of "$1") || return 1
	alive "$p" || return 1
	cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || return 1
	local k
	k=$(kind "$1")
	case ${k%-tls} in
	redis) [[ $cmd == *redis-server* ]] ;;
	memcached) [[ $cmd == *memcached* ]] ;;
	postgres) [[ $cmd == *postgres* ]] ;;
	mariadb) [[ $cmd == *mariadbd* ]] ;;
	etcd) [[ $cmd == *etcd* ]] ;;
	zk) [[ $cmd == *java* && $cmd == *QuorumPeerMain* ]] ;;
	esac
}

# tcp_open PORT: something accepts connections on 127.0.0.1:PORT.
tcp_open() {
	# shellcheck disable=SC2016 # $1 is expanded by the inner bash
	timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# spawn NAME CMD...: start CMD in its own session, output to the instance log, pid recorded.
spawn() {
	local d
	d=$(idir "$1")
	shift
	# No fd but 0-2 is inherited: fd 9 is this script's lock, and a caller's (a test run
	# under flock(1) that restarts a server) would be held for as long as the server runs.
	(
		cd "$d" || exit
		for f in /proc/$BASHPID/fd/*; do
			f=${f##*/}
			((f > 2)) && eval "exec $f>&-"
		done
		exec setsid "$@"
	) </dev/null >>"$d/server.log" 2>&1 &
	echo $! >"$d/pid"
}

as_postgres() {
	if [[ $EUID -eq 0 ]]; then
		setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
	else
		"$@"
	fi
}

# ---------------------------------------------------------------- start

start_redis() {
	local n=$1 d p
	d=$(idir "$n")
	p=$(port "$n")
	mkdir -p "$d/data"
	cat >"$d/redis.conf" <<EOF
bind 127.0.0.1
port $p
protected-mode yes
daemonize no
dir $d/data
logfile ""
save ""
appendonly no
maxmemory-policy noeviction
enable-debug-command local
EOF
	if [[ $n == redis-c* ]]; then
		# Without persistence a member's keys are gone anyway; nodes.conf (its node id, slots,
		# peers) is kept only to rejoin a cluster the other members still run. Otherwise the
		# member starts empty and cluster_up creates the cluster again.
		local m keep=""
		for m in "${CLUSTER[@]}"; do
			[[ $m != "$n" ]] && cluster_formed_at "$m" && keep=$m
		done
		if [[ -n $keep && -s $d/data/nodes.conf ]]; then
			log "$n: rejoining the cluster of $keep with its nodes.conf"
		else
			rm -f "$d/data/nodes.conf"
		fi
		cat >>"$d/redis.conf" <<EOF
cluster-enabled yes
cluster-config-file $d/data/nodes.conf
cluster-node-timeout 5000
EOF
	fi
	spawn "$n" redis-server "$d/redis.conf"
}

# ---------------------------------------------------------------- redis cluster

# rcli PORT ARGS...: one redis-cli command against 127.0.0.1:PORT, bounded, CRs dropped.
rcli() {
	local p=$1 out
	shift
	out=$(timeout 5 redis-cli -h 127.0.0.1 -p "$p" "$@" 2>/dev/null) || return 1
	printf '%s\n' "${out//$'\r'/}"
}

# cluster_field NAME FIELD: a field of CLUSTER INFO on that member (fails if it does not answer).
cluster_field() {
	local info
	info=$(rcli "$(port "$1")" cluster info) || return 1
	sed -n "s/^$2://p" <<<"$info"
}

# cluster_formed_at NAME: the member answers and has slots, i.e. belongs to a formed cluster
# (whether its state is ok or not).
cluster_formed_at() {
	local s
	s=$(cluster_field "$1" cluster_slots_assigned) || return 1
	[[ -n $s && $s != 0 ]]
}

# cluster_check: the state of the three members, which all answer:
#   ok      cluster_state:ok on all three, each knowing exactly the three members' node ids
#   formed  the same three ids everywhere and every slot assigned, not (yet) ok everywhere:
#           a restarted member rejoining, failure flags being cleared
#   empty   three fresh nodes (one known node, no slot, no key): ready for --cluster create
#   broken  anything else (a member lost its nodes.conf, a half-made cluster, ...)
cluster_check() {
	local m p id ids=() want info nodes all_ok=1 all_empty=1 same=1
	for m in "${CLUSTER[@]}"; do
		id=$(rcli "$(port "$m")" cluster myid) || id=""
		ids+=("${id:-?}")
	done
	want=$(printf '%s\n' "${ids[@]}" | sort | tr '\n' ' ')
	for m in "${CLUSTER[@]}"; do
		p=$(port "$m")
		info=$(rcli "$p" cluster info) || info=""
		nodes=$(rcli "$p" cluster nodes | awk 'NF { print $1 }' | sort | tr '\n' ' ') || nodes=""
		[[ $info == *cluster_state:ok* ]] || all_ok=""
		[[ $info == *cluster_slots_assigned:16384* && $nodes == "$want" ]] || same=""
		[[ $info == *cluster_slots_assigned:0$'\n'* && $info == *cluster_known_nodes:1$'\n'* &&
			$(rcli "$p" dbsize) == 0 ]] || all_empty=""
	done
	if [[ -n $same && -n $all_ok ]]; then
		echo ok
	elif [[ -n $same ]]; then
		echo formed
	elif [[ -n $all_empty ]]; then
		echo empty
	else
		echo broken
	fi
}

cluster_fail_tails() {
	local m
	for m in "${CLUSTER[@]}"; do
		printf '%s\n' "----- $m: cluster nodes, last lines of $(idir "$m")/server.log -----" >&2
		rcli "$(port "$m")" cluster nodes >&2 || true
		tail -n 10 "$(idir "$m")/server.log" >&2 || true
	done
}

# cluster_up DEADLINE: once the three members answer, create the cluster if it is not formed
# and wait until cluster_state:ok on all three. A member that this script does not run (and
# that was not asked for) leaves the cluster down with a warning, not an error; nothing is
# done to the others then.
cluster_up() {
	local deadline=$1 m missing=() state addrs=() clog
	for m in "${CLUSTER[@]}"; do
		running "$m" && answers "$m" || missing+=("$m")
		addrs+=("127.0.0.1:$(port "$m")")
	done
	if ((${#missing[@]} > 0)); then
		log "redis-cluster: ${missing[*]} not running, so cluster_state stays fail (scripts/services.sh up redis-cluster)"
		return 0
	fi
	state=$(cluster_check)
	if [[ $state == ok ]]; then
		log "redis-cluster: cluster_state:ok"
		return 0
	fi
	clog=$(idir redis-c1)/cluster-create.log
	if [[ $state == broken ]]; then
		log "redis-cluster: the members disagree; emptying them (FLUSHALL, CLUSTER RESET HARD) to create it again"
		for m in "${CLUSTER[@]}"; do
			rcli "$(port "$m")" flushall >/dev/null && rcli "$(port "$m")" cluster reset hard >/dev/null ||
				die "redis-cluster: could not reset $m"
		done
		state=empty
	fi
	if [[ $state == empty ]]; then
		log "redis-cluster: creating the cluster on ${addrs[*]}"
		printf '\n===== %s cluster create =====\n' "$(date '+%F %T')" >>"$clog"
		if ! timeout "$((deadline - SECONDS > 10 ? deadline - SECONDS : 10))" \
			redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes </dev/null >>"$clog" 2>&1; then
			tail -n 20 "$clog" >&2
			log "redis-cluster: redis-cli --cluster create failed (log: $clog)"
			return 1
		fi
	else
		log "redis-cluster: formed, waiting for cluster_state:ok"
	fi
	while [[ $(cluster_check) != ok ]]; do
		if ((SECONDS >= deadline)); then
			log "redis-cluster: no cluster_state:ok on all three after ${TIMEOUT}s"
			cluster_fail_tails
			return 1
		fi
		sleep 0.2
	done
	log "redis-cluster: cluster_state:ok on ${addrs[*]}"
}

start_memcached() {
	local n=$1 p mem=64 user=()
	p=$(port "$n")
	[[ $n == memcached-small ]] && mem=2
	if [[ $EUID -eq 0 ]]; then
		if id memcache >/dev/null 2>&1; then user=(-u memcache); else user=(-u nobody); fi
	fi
	mkdir -p "$(idir "$n")"
	spawn "$n" memcached "${user[@]}" -l 127.0.0.1 -p "$p" -U 0 -m "$mem" -t 2
}

# The Debian package creates (and, with an init system, starts) its own cluster, normally
# 15/main on 5432. Stop any Debian cluster on our port and keep it from starting again.
pg_clear_debian_cluster() {
	command -v pg_lsclusters >/dev/null || return 0
	local p=$1 ver name cport status
	while read -r ver name cport status _; do
		[[ $cport == "$p" ]] || continue
		if [[ $status == online* ]]; then
			log "postgres: stopping Debian cluster $ver/$name, it holds port $p"
			pg_ctlcluster "$ver" "$name" stop -m fast || true
		fi
		local sc=/etc/postgresql/$ver/$name/start.conf
		if [[ -w $sc ]] && grep -qx 'auto' "$sc"; then
			log "postgres: setting $sc to manual (Debian cluster $ver/$name uses port $p)"
			sed -i 's/^auto$/manual/' "$sc"
		fi
	done < <(pg_lsclusters -h 2>/dev/null)
}

# pg_dir [NAME]: the instance dir of a postgres instance (default: postgres), which must be
# reachable by the postgres user. If the repo lives where it is not (e.g. under /root), the data
# goes to /var/tmp and $DIR/NAME is a symlink to it.
pg_dir() {
	local n=${1:-postgres}
	local d=$DIR/$n
	if [[ -e $d || -L $d ]]; then
		readlink -f "$d"
		return
	fi
	if [[ $EUID -eq 0 ]] && ! setpriv --reuid=postgres --regid=postgres --init-groups -- test -x "$DIR"; then
		local alt
		alt=/var/tmp/locker-services-$(printf '%s' "$DIR" | md5sum | cut -c1-12)/$n
		mkdir -p "$alt"
		ln -s "$alt" "$d"
		log "$n: $DIR is not reachable by user postgres; data in $alt"
		printf '%s\n' "$alt"
		return
	fi
	mkdir -p "$d"
	printf '%s\n' "$d"
}

start_postgres() {
	local n=postgres d p bin user
	bin=$(pg_bin) || die "postgres: binaries not found"
	p=$(port $n)
	user=$(pg_url_part user)
	pg_clear_debian_cluster "$p"
	d=$(pg_dir)
	[[ $EUID -eq 0 ]] && chown postgres:postgres "$d"
	if [[ ! -s $d/data/PG_VERSION ]]; then
		rm -rf "$d/data"
		log "postgres: initdb $d/data (superuser $user)"
		if ! (cd "$d" && as_postgres "$bin/initdb" -D "$d/data" -U "$user" --auth=trust -E UTF8 --locale=C --no-sync 9>&-) >"$d/initdb.log" 2>&1; then
			tail -n 20 "$d/initdb.log" >&2
			die "postgres: initdb failed"
		fi
	fi
	pg_spawn "$n" "$bin" "$d" "$p" -c max_connections=300 -c shared_buffers=64MB
}

# pg_spawn NAME BIN DIR PORT SETTINGS...: run postgres on DIR/data with the settings every
# instance shares (loopback, no durability) and SETTINGS, as user postgres when root.
pg_spawn() {
	local n=$1 bin=$2 d=$3 p=$4
	shift 4
	local pgcmd=("$bin/postgres" -D "$d/data"
		-c listen_addresses=127.0.0.1 -c port="$p" -c unix_socket_directories="$d"
		-c fsync=off -c synchronous_commit=off -c full_page_writes=off
		-c logging_collector=off -c log_min_messages=warning "$@")
	if [[ $EUID -eq 0 ]]; then
		pgcmd=(setpriv --reuid=postgres --regid=postgres --init-groups -- "${pgcmd[@]}")
	fi
	spawn "$n" "${pgcmd[@]}"
}

etcd_members() {
	case $1 in
	etcd) printf 'etcd=http://127.0.0.1:%s' "$(etcd_peer_port etcd)" ;;
	etcd-c*)
		local i s=""
		for i in 1 2 3; do
			s+="${s:+,}etcd-c$i=http://127.0.0.1:$(etcd_peer_port "etcd-c$i")"
		done
		printf '%s' "$s"
		;;
	esac
}

start_etcd() {
	local n=$1 d p pp state=new token=locker-etcd
	d=$(idir "$n")
	p=$(port "$n")
	pp=$(etcd_peer_port "$n")
	[[ $n == etcd-c* ]] && token=locker-etcd-cluster
	mkdir -p "$d"
	# etcd ignores the initial-cluster flags once data/member exists: a restart rejoins.
	[[ -d $d/data/member ]] && state=existing
	mkdir -p "$d/data"
	chmod 700 "$d/data"
	spawn "$n" etcd \
		--name "$n" --data-dir "$d/data" \
		--listen-client-urls "http://127.0.0.1:$p" --advertise-client-urls "http://127.0.0.1:$p" \
		--listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
		--initial-cluster "$(etcd_members "$n")" --initial-cluster-token "$token" \
		--initial-cluster-state "$state" --logger zap --log-outputs stderr
}

start_zk() {
	local n=$1 d p cp i
	d=$(idir "$n")
	p=$(port "$n")
	cp=$(zk_classpath) || die "zk: /usr/share/java/zookeeper.jar not found"
	mkdir -p "$d/data"
	{
		zk_common_cfg "$d"
		echo "clientPort=$p"
		echo "clientPortAddress=127.0.0.1"
	} >"$d/zoo.cfg"
	if [[ $n == zk-e* ]]; then
		idx "$n" >"$d/data/myid"
		for i in 1 2 3; do
			local q e
			q=$(nth "$LOCKER_ZK_QUORUM_PORTS" "$i") || die "zk: no quorum port $i in LOCKER_ZK_QUORUM_PORTS"
			e=$(nth "$LOCKER_ZK_ELECTION_PORTS" "$i") || die "zk: no election port $i in LOCKER_ZK_ELECTION_PORTS"
			echo "server.$i=127.0.0.1:$q:$e" >>"$d/zoo.cfg"
		done
	fi
	zk_spawn "$n" "$d" "$cp"
}

# zk_common_cfg DIR: the zoo.cfg lines every ZooKeeper instance shares.
zk_common_cfg() {
	cat <<EOF
tickTime=500
initLimit=20
syncLimit=10
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$1/data
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
EOF
}

# zk_spawn NAME DIR CLASSPATH [JAVA_FLAG...]: run ZooKeeper on DIR/zoo.cfg, logging to the
# console (the instance log). Empty container nodes (zklock's names) go within a second:
# znode.container.checkIntervalMs is a Java system property, not a zoo.cfg key (zoo.cfg
# would set zookeeper.znode.container.checkIntervalMs, which nothing reads). The default
# maxPerMinute (10,000) is below what a benchmark makes: its names outgrew the heap.
zk_spawn() {
	local n=$1 d=$2 cp=$3
	shift 3
	cat >"$d/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} - %-5p [%t:%C{1}@%L] - %m%n
EOF
	spawn "$n" java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Djava.net.preferIPv4Stack=true -Dzookeeper.forceSync=no \
		-Dznode.container.checkIntervalMs=1000 -Dznode.container.maxPerMinute=120000 \
		-Dzookeeper.jmx.log4j.disable=true -Dlog4j.configuration="file:$d/log4j.properties" \
		-Dorg.slf4j.simpleLogger.showDateTime=true "$@" \
		-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
}

# ---------------------------------------------------------------- secured instances

# make_certs: a throw-away CA and its certificates in $DIR/certs, made once (kept across
# restarts so a running client's trust stays valid). Names: see the header.
make_certs() {
	local c=$DIR/certs
	[[ -s $c/admin.pem ]] && return 0
	mkdir -p "$c"
	log "certs: making a throw-away CA and certificates in $c"
	(
		cd "$c"
		openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
			-subj "/CN=locker services CA" -keyout ca-key.pem -out ca.pem
		leaf() { # leaf NAME CN EXT
			openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
				-keyout "$1-key.pem" -out "$1.csr"
			printf '%s\n' "$3" >"$1.ext"
			openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
				-extfile "$1.ext" -out "$1.pem"
			rm -f "$1.csr" "$1.ext"
		}
		leaf server "locker services server" \
			"subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth"
		leaf client locker "extendedKeyUsage=clientAuth"
		leaf admin root "extendedKeyUsage=clientAuth"
		chmod 644 ./*.pem
	) >"$DIR/certs.log" 2>&1 || {
		tail -n 20 "$DIR/certs.log" >&2
		rm -rf "$c"
		die "certs: openssl failed (log: $DIR/certs.log)"
	}
}

# start_redis-tls NAME: Redis on a TLS port only, client certificates required, ACL users:
# the default user off, admin (LOCKER_SECURE_ADMIN_PASSWORD) with every permission. Tests make
# their own users with ACL SETUSER. The config holds the password: mode 600.
start_redis-tls() {
	local n=$1 d p c=$DIR/certs
	d=$(idir "$n")
	p=$(port "$n")
	mkdir -p "$d/data"
	(
		umask 077
		cat >"$d/redis.conf" <<EOF
bind 127.0.0.1
port 0
tls-port $p
tls-cert-file $c/server.pem
tls-key-file $c/server-key.pem
tls-ca-cert-file $c/ca.pem
tls-auth-clients yes
protected-mode yes
daemonize no
dir $d/data
logfile ""
save ""
appendonly no
maxmemory-policy noeviction
user default off
user admin on >$LOCKER_SECURE_ADMIN_PASSWORD ~* &* +@all
EOF
	)
	chmod 600 "$d/redis.conf"
	spawn "$n" redis-server "$d/redis.conf"
}

# redis_tls_cli PORT ARGS...: redis-cli as admin over TLS with the admin certificate; the
# password goes through the environment, not the command line.
redis_tls_cli() {
	local p=$1 c=$DIR/certs
	shift
	REDISCLI_AUTH=$LOCKER_SECURE_ADMIN_PASSWORD timeout 3 redis-cli -h 127.0.0.1 -p "$p" --tls \
		--cacert "$c/ca.pem" --cert "$c/admin.pem" --key "$c/admin-key.pem" --user admin "$@" 2>/dev/null
}

# pg_install_secret FILE MODE SRC: copy SRC to FILE with MODE, owned by the server's user.
pg_install_secret() {
	if [[ $EUID -eq 0 ]]; then
		install -m "$2" -o postgres -g postgres "$3" "$1"
	else
		install -m "$2" "$3" "$1"
	fi
}

# postgres-tls: its own cluster, TLS only (the services CA; a client certificate is checked
# when one is sent, not required), scram-sha-256 passwords, superuser admin.
start_postgres-tls() {
	local n=$1 d p bin c=$DIR/certs
	bin=$(pg_bin) || die "$n: postgres binaries not found"
	p=$(port "$n")
	pg_clear_debian_cluster "$p"
	d=$(pg_dir "$n")
	[[ $EUID -eq 0 ]] && chown postgres:postgres "$d"
	if [[ ! -s $d/data/PG_VERSION ]]; then
		rm -rf "$d/data"
		log "$n: initdb $d/data (superuser admin, scram-sha-256)"
		local pw=$d/initdb.pw rc=0
		(umask 077 && printf '%s\n' "$LOCKER_SECURE_ADMIN_PASSWORD" >"$pw")
		[[ $EUID -eq 0 ]] && chown postgres:postgres "$pw"
		(cd "$d" && as_postgres "$bin/initdb" -D "$d/data" -U admin --pwfile="$pw" --auth=scram-sha-256 \
			-E UTF8 --locale=C --no-sync 9>&-) >"$d/initdb.log" 2>&1 || rc=$?
		rm -f "$pw"
		if ((rc != 0)); then
			tail -n 20 "$d/initdb.log" >&2
			die "$n: initdb failed"
		fi
	fi
	# The server refuses a key that others can read; it runs as postgres.
	pg_install_secret "$d/data/server.key" 600 "$c/server-key.pem"
	pg_install_secret "$d/data/server.crt" 644 "$c/server.pem"
	pg_install_secret "$d/data/root.crt" 644 "$c/ca.pem"
	local hba
	hba=$(mktemp)
	cat >"$hba" <<'EOF'
# postgres-tls (scripts/services.sh): TLS and a password, nothing else.
local     all all              scram-sha-256
hostssl   all all 127.0.0.1/32 scram-sha-256
hostnossl all all 0.0.0.0/0    reject
host      all all ::/0         reject
EOF
	pg_install_secret "$d/data/pg_hba.conf" 600 "$hba"
	rm -f "$hba"
	pg_spawn "$n" "$bin" "$d" "$p" \
		-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=root.crt \
		-c password_encryption=scram-sha-256 -c max_connections=100 -c shared_buffers=32MB
}

# pg_tls_psql ARGS...: psql to postgres-tls as admin, verifying the server against the CA.
pg_tls_psql() {
	local bin
	bin=$(pg_bin) || return 1
	PGPASSWORD=$LOCKER_SECURE_ADMIN_PASSWORD PGCONNECT_TIMEOUT=3 timeout 10 "$bin/psql" \
		"host=127.0.0.1 port=$(port postgres-tls) user=admin dbname=postgres sslmode=verify-full sslrootcert=$DIR/certs/ca.pem" \
		-XAtq "$@"
}

# start_etcd-tls NAME: a single member serving clients over TLS only, with client
# certificates required (CN = user when no password is given); the peer port is plain http on
# loopback. Auth is switched on by etcd_tls_auth once it answers.
start_etcd-tls() {
	local n=$1 d p pp c=$DIR/certs state=new
	d=$(idir "$n")
	p=$(port "$n")
	pp=$(etcd_peer_port "$n")
	[[ -d $d/data/member ]] && state=existing
	mkdir -p "$d/data"
	chmod 700 "$d/data"
	spawn "$n" etcd \
		--name "$n" --data-dir "$d/data" \
		--listen-client-urls "https://127.0.0.1:$p" --advertise-client-urls "https://127.0.0.1:$p" \
		--cert-file "$c/server.pem" --key-file "$c/server-key.pem" \
		--client-cert-auth --trusted-ca-file "$c/ca.pem" \
		--listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
		--initial-cluster "$n=http://127.0.0.1:$pp" --initial-cluster-token locker-etcd-tls \
		--initial-cluster-state "$state" --logger zap --log-outputs stderr
}

# etcdctl_tls ARGS...: etcdctl against etcd-tls as root, by the admin certificate's CN.
etcdctl_tls() {
	local c=$DIR/certs
	ETCDCTL_API=3 timeout 5 etcdctl --endpoints "https://127.0.0.1:$(port etcd-tls)" \
		--cacert "$c/ca.pem" --cert "$c/admin.pem" --key "$c/admin-key.pem" \
		--dial-timeout 2s --command-timeout 3s "$@"
}

# etcd_tls_auth: the root user (password LOCKER_SECURE_ADMIN_PASSWORD) with the root role,
# and auth enabled. Idempotent: the data dir persists, and with auth on the admin certificate
# still authenticates as root.
etcd_tls_auth() {
	local out
	out=$(etcdctl_tls user get root 2>&1) ||
		printf '%s\n' "$LOCKER_SECURE_ADMIN_PASSWORD" | etcdctl_tls user add root --interactive=false >/dev/null 2>&1 ||
		return 1
	[[ $out == *"Roles: root"* ]] || etcdctl_tls user grant-role root root >/dev/null 2>&1 ||
		{ etcdctl_tls role add root >/dev/null 2>&1 && etcdctl_tls user grant-role root root >/dev/null 2>&1; } ||
		return 1
	etcdctl_tls auth enable >/dev/null 2>&1
}

# zk_tls_classpath: zookeeper.jar's manifest names only part of Netty (buffer, common, handler,
# transport, native-epoll); without netty-codec (libnetty-java, as the others) the server
# binds its TLS port but closes every connection (NoClassDefFoundError ByteToMessageDecoder).
zk_tls_classpath() {
	local cp
	cp=$(zk_classpath) || return 1
	[[ -r /usr/share/java/netty-codec.jar ]] || return 1
	printf '%s\n' "$cp:/usr/share/java/netty-codec.jar"
}

# zk_super_digest: the digest of admin:$LOCKER_SECURE_ADMIN_PASSWORD that ZooKeeper's
# superDigest wants, base64(sha1("admin:" + password)).
zk_super_digest() {
	printf 'admin:%s' "$LOCKER_SECURE_ADMIN_PASSWORD" | openssl dgst -sha1 -binary | base64
}

# zk-tls: a standalone ZooKeeper like start_zk's, with a TLS client port only (Netty; PEM
# keystore and truststore; client certificates required) and the super user admin.
start_zk-tls() {
	local n=$1 d p cp c=$DIR/certs
	d=$(idir "$n")
	p=$(port "$n")
	cp=$(zk_tls_classpath) || die "$n: zookeeper.jar or a Netty jar (libnetty-java) missing in /usr/share/java"
	mkdir -p "$d/data"
	# ZooKeeper's PEM keystore is the key and the certificate in one file.
	cat "$c/server-key.pem" "$c/server.pem" >"$d/keystore.pem"
	chmod 600 "$d/keystore.pem"
	zk_common_cfg "$d" >"$d/zoo.cfg"
	cat >>"$d/zoo.cfg" <<EOF
secureClientPort=$p
secureClientPortAddress=127.0.0.1
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider
ssl.keyStore.location=$d/keystore.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$c/ca.pem
ssl.trustStore.type=PEM
ssl.clientAuth=need
EOF
	zk_spawn "$n" "$d" "$cp" -Dzookeeper.DigestAuthenticationProvider.superDigest="admin:$(zk_super_digest)"
}

# my_spawn NAME INIT_SQL [OPTION_LINE...]: a mariadbd on DIR/data configured by DIR/my.cnf
# alone (--defaults-file: /etc/mysql and ~/.my.cnf are not read), with OPTION_LINEs added to
# its [mysqld] section. mariadb-install-db runs once (DIR/installed records it); INIT_SQL
# (database, users, grants: idempotent) runs in the server at every start, before it accepts
# connections, so a password or grant changed here applies on the next start. A failing
# statement there does not stop the server: the readiness check logs in as the user it makes.
my_spawn() {
	local n=$1 sql=$2 d p
	shift 2
	d=$(idir "$n")
	p=$(port "$n")
	mkdir -p "$d/files"
	(
		umask 077
		cat >"$d/my.cnf" <<EOF
# $n (scripts/services.sh): the only option file this instance reads.
[mysqld]
datadir=$d/data
port=$p
bind-address=127.0.0.1
socket=$d/sock
pid-file=$d/mariadbd.pid
skip-name-resolve
secure-file-priv=$d/files
local-infile=0
character-set-server=utf8mb4
max-connections=300
performance-schema=OFF
key-buffer-size=1M
aria-pagecache-buffer-size=8M
innodb-buffer-pool-size=32M
innodb-log-file-size=8M
innodb-flush-log-at-trx-commit=2
innodb-doublewrite=0
innodb-buffer-pool-dump-at-shutdown=0
innodb-buffer-pool-load-at-startup=0
EOF
		# mariadbd refuses to run as root unless told to.
		[[ $EUID -eq 0 ]] && echo user=root >>"$d/my.cnf"
		printf '%s\n' "$@" >>"$d/my.cnf"
		printf '%s\n' "$sql" >"$d/init.sql"
	)
	if [[ ! -e $d/installed || ! -d $d/data/mysql ]]; then
		rm -rf "$d/data"
		log "$n: mariadb-install-db $d/data"
		# --defaults-file has to come first.
		if ! (cd "$d" && "$(my_bin mariadb-install-db)" --defaults-file="$d/my.cnf" --skip-test-db \
			--auth-root-authentication-method=socket 9>&-) >"$d/install.log" 2>&1; then
			tail -n 20 "$d/install.log" >&2
			die "$n: mariadb-install-db failed (log: $d/install.log)"
		fi
		touch "$d/installed"
	fi
	# init-file on the command line: mariadb-install-db would run it too from my.cnf.
	spawn "$n" "$(my_bin mariadbd)" --defaults-file="$d/my.cnf" --init-file="$d/init.sql"
}

# my_grant_sql USER PASSWORD DB PRIVILEGES [WITH...]: create DB and USER@127.0.0.1 and
# USER@localhost (the unix socket; skip-name-resolve makes every TCP client an address) with
# PRIVILEGES, and drop install-db's proxy grant to root@<this host's name>: nothing is
# granted beyond loopback.
my_grant_sql() {
	local u="'$1'@'127.0.0.1', '$1'@'localhost'"
	cat <<EOF
DELETE FROM mysql.proxies_priv WHERE Host <> 'localhost';
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS \`$3\`;
CREATE USER IF NOT EXISTS $u;
ALTER USER '$1'@'127.0.0.1' IDENTIFIED BY '$2', '$1'@'localhost' IDENTIFIED BY '$2';
GRANT $4 TO $u${5:+ $5};
EOF
}

# mariadb: the user, password and database of LOCKER_MYSQL_URL, all privileges on that
# database only (tests create and drop their tables there).
start_mariadb() {
	local user pw db
	# start_one runs in an if (no set -e), and die in $(...) ends only the subshell.
	user=$(my_url_part user) && pw=$(my_url_part password) && db=$(my_url_part db) || exit 1
	my_spawn "$1" "$(my_grant_sql "$user" "$pw" "$db" "ALL PRIVILEGES ON \`$db\`.*")"
}

# mariadb-tls: TLS required for every TCP client (the services CA; a client certificate is
# checked when one is sent, not required); admin may grant everything, so tests make
# least-privilege users of their own.
start_mariadb-tls() {
	local c=$DIR/certs
	my_spawn "$1" "$(my_grant_sql admin "$LOCKER_SECURE_ADMIN_PASSWORD" locker "ALL PRIVILEGES ON *.*" "WITH GRANT OPTION")" \
		require-secure-transport=ON "ssl-cert=$c/server.pem" "ssl-key=$c/server-key.pem" "ssl-ca=$c/ca.pem"
}

# my_client NAME USER PASSWORD ARG...: the mariadb client over TCP to NAME, bounded, batch
# output; the password goes through the environment, not the command line.
my_client() {
	local n=$1 user=$2 pw=$3
	shift 3
	MYSQL_PWD=$pw timeout 10 mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$(port "$n")" \
		-u "$user" --connect-timeout=3 -NB "$@"
}

# start_one NAME: start it unless it already runs. Returns 1 if it could not be started.
start_one() {
	local n=$1 p
	if running "$n"; then
		log "$n: already running (pid $(pid_of "$n"))"
		return 0
	fi
	p=$(port "$n")
	if tcp_open "$p"; then
		log "$n: port 127.0.0.1:$p is already taken by a process this script did not start:"
		if command -v ss >/dev/null; then ss -ltnpH "sport = :$p" >&2 || true; fi
		return 1
	fi
	mkdir -p "$(idir "$n")"
	rm -f "$(idir "$n")/pid"
	printf '\n===== %s start %s =====\n' "$(date '+%F %T')" "$n" >>"$(idir "$n")/server.log"
	log "$n: starting on 127.0.0.1:$p"
	"start_$(kind "$n")" "$n"
}

# ---------------------------------------------------------------- readiness

# ready NAME: the server answers a real request; a Redis Cluster member also has to report
# cluster_state:ok.
ready() {
	answers "$1" || return 1
	[[ $1 != redis-c* ]] || [[ $(cluster_field "$1" cluster_state) == ok ]]
}

# answers NAME: the server answers a real request (PING for redis, cluster or not).
answers() {
	local n=$1 p
	p=$(port "$n")
	case $(kind "$n") in
	redis) [[ $(timeout 3 redis-cli -h 127.0.0.1 -p "$p" ping 2>/dev/null) == PONG ]] ;;
	memcached)
		# shellcheck disable=SC2016
		timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "version\r\n" >&3 && IFS= read -r l <&3 && [[ $l == VERSION* ]]' _ "$p" 2>/dev/null
		;;
	postgres)
		local bin user db
		bin=$(pg_bin) || return 1
		user=$(pg_url_part user)
		db=$(pg_url_part db)
		timeout 3 "$bin/pg_isready" -q -h 127.0.0.1 -p "$p" -U "$user" -d postgres || return 1
		local has
		has=$(PGCONNECT_TIMEOUT=3 timeout 5 "$bin/psql" -h 127.0.0.1 -p "$p" -U "$user" -d postgres -XAtq \
			-c "select 1 from pg_database where datname = '$db'" 2>/dev/null) || return 1
		if [[ $has != 1 ]]; then
			[[ -n ${PG_CREATE_DB:-} ]] || return 1
			PGCONNECT_TIMEOUT=3 timeout 10 "$bin/createdb" -h 127.0.0.1 -p "$p" -U "$user" "$db" >/dev/null 2>&1 || return 1
		fi
		;;
	etcd)
		ETCDCTL_API=3 timeout 5 etcdctl --endpoints "http://127.0.0.1:$p" --dial-timeout 2s \
			--command-timeout 3s endpoint health >/dev/null 2>&1
		;;
	zk)
		local out
		# shellcheck disable=SC2016
		out=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf srvr >&3 && cat <&3' _ "$p" 2>/dev/null) || true
		[[ $out == *"Mode: "* ]]
		;;
	postgres-tls)
		local has
		has=$(pg_tls_psql -c "select 1 from pg_database where datname = 'locker'" 2>/dev/null) || return 1
		if [[ $has != 1 ]]; then
			[[ -n ${PG_CREATE_DB:-} ]] || return 1
			pg_tls_psql -c "create database locker" >/dev/null 2>&1 || return 1
		fi
		;;
	zk-tls)
		local out c=$DIR/certs
		out=$(printf srvr | timeout 5 openssl s_client -quiet -connect "127.0.0.1:$p" -CAfile "$c/ca.pem" \
			-cert "$c/client.pem" -key "$c/client-key.pem" 2>/dev/null) || true
		[[ $out == *"Mode: "* ]]
		;;
	redis-tls) [[ $(redis_tls_cli "$p" ping) == PONG ]] ;;
	mariadb)
		[[ $(my_client "$n" "$(my_url_part user)" "$(my_url_part password)" -e 'select 1' "$(my_url_part db)" 2>/dev/null) == 1 ]]
		;;
	mariadb-tls)
		[[ $(my_client "$n" admin "$LOCKER_SECURE_ADMIN_PASSWORD" --ssl-ca="$DIR/certs/ca.pem" \
			--ssl-verify-server-cert -e 'select 1' locker 2>/dev/null) == 1 ]]
		;;
	etcd-tls) etcdctl_tls endpoint health >/dev/null 2>&1 && etcd_tls_auth ;;
	esac
}

# wait_ready DEADLINE NAME...: wait until every NAME answers; print log tails of the ones that
# fail. (For the cluster members, cluster_up then waits for cluster_state:ok.)
wait_ready() {
	local deadline=$1 n failed=()
	shift
	for n in "$@"; do
		while ! answers "$n"; do
			if ! running "$n"; then
				log "$n: process exited"
				failed+=("$n")
				continue 2
			fi
			if ((SECONDS >= deadline)); then
				log "$n: no answer on 127.0.0.1:$(port "$n") after ${TIMEOUT}s"
				failed+=("$n")
				continue 2
			fi
			sleep 0.2
		done
		log "$n: up on 127.0.0.1:$(port "$n")"
	done
	for n in "${failed[@]}"; do
		printf '%s\n' "----- $n: last lines of $(idir "$n")/server.log -----" >&2
		tail -n 25 "$(idir "$n")/server.log" >&2 || true
	done
	if ((${#failed[@]} > 0)); then
		log "failed: ${failed[*]}"
		return 1
	fi
}

# ---------------------------------------------------------------- stop

stop_one() {
	local n=$1 p sig=TERM i
	if ! running "$n"; then
		rm -f "$(idir "$n")/pid"
		log "$n: not running"
		return 0
	fi
	p=$(pid_of "$n")
	[[ $(kind "$n") == postgres* ]] && sig=INT # fast shutdown
	kill -s "$sig" "$p" 2>/dev/null || true
	for ((i = 0; i < 300; i++)); do
		alive "$p" || break
		sleep 0.1
	done
	if alive "$p"; then
		log "$n: still running after 30s, SIGKILL"
		kill -s KILL "$p" 2>/dev/null || true
		while alive "$p"; do sleep 0.1; done
	fi
	rm -f "$(idir "$n")/pid"
	log "$n: stopped"
}

# ---------------------------------------------------------------- commands

print_env() {
	cat <<EOF
export LOCKER_REDIS_ADDR=$LOCKER_REDIS_ADDR
export LOCKER_REDIS_QUORUM_ADDRS=$LOCKER_REDIS_QUORUM_ADDRS
export LOCKER_REDIS_CLUSTER_ADDRS=$LOCKER_REDIS_CLUSTER_ADDRS
export LOCKER_MEMCACHE_ADDR=$LOCKER_MEMCACHE_ADDR
export LOCKER_MEMCACHE_SMALL_ADDR=$LOCKER_MEMCACHE_SMALL_ADDR
export LOCKER_REDIS_RESTART_ADDR=$LOCKER_REDIS_RESTART_ADDR
export LOCKER_MEMCACHE_RESTART_ADDR=$LOCKER_MEMCACHE_RESTART_ADDR
export LOCKER_POSTGRES_URL='$LOCKER_POSTGRES_URL'
export LOCKER_MYSQL_URL='$LOCKER_MYSQL_URL'
export LOCKER_ETCD_ENDPOINTS=$LOCKER_ETCD_ENDPOINTS
export LOCKER_ETCD_CLUSTER_ENDPOINTS=$LOCKER_ETCD_CLUSTER_ENDPOINTS
export LOCKER_ZK_ADDR=$LOCKER_ZK_ADDR
export LOCKER_ZK_ENSEMBLE=$LOCKER_ZK_ENSEMBLE
export LOCKER_REDIS_TLS_ADDR=$LOCKER_REDIS_TLS_ADDR
export LOCKER_POSTGRES_TLS_ADDR=$LOCKER_POSTGRES_TLS_ADDR
export LOCKER_MYSQL_TLS_ADDR=$LOCKER_MYSQL_TLS_ADDR
export LOCKER_ETCD_TLS_ENDPOINT=$LOCKER_ETCD_TLS_ENDPOINT
export LOCKER_ZK_TLS_ADDR=$LOCKER_ZK_TLS_ADDR
export LOCKER_SECURE_CERTS=$DIR/certs
export LOCKER_SECURE_ADMIN_PASSWORD=$LOCKER_SECURE_ADMIN_PASSWORD
EOF
}

lock() {
	exec 9>"$DIR/.lock"
	flock -w 600 9 || die "could not lock $DIR/.lock"
}

prepare_dir() {
	mkdir -p "$DIR"
	DIR=$(cd "$DIR" && pwd)
	# the postgres user has to get through it
	chmod 755 "$DIR" 2>/dev/null || true
}

cmd_up() {
	local names kinds n rc=0
	mapfile -t names < <(expand "${@:-all}")
	mapfile -t kinds < <(for n in "${names[@]}"; do kind "$n"; done | sort -u)
	lock
	install_kinds "${kinds[@]}"
	PG_CREATE_DB=1
	[[ " ${names[*]} " == *-tls\ * ]] && make_certs
	local deadline=$((SECONDS + TIMEOUT)) started=() members=() member_failed=""
	for n in "${names[@]}"; do
		if start_one "$n"; then
			if [[ $n == redis-c* ]]; then members+=("$n"); else started+=("$n"); fi
		else
			rc=1
			[[ $n == redis-c* ]] && member_failed=1
		fi
	done
	# The cluster first: it is formed while the slower servers boot. Not when a member could
	# not be started: its port may belong to a foreign server, the cluster is left alone.
	if [[ -n $member_failed ]]; then
		log "redis-cluster: not formed, a member could not be started"
	elif ((${#members[@]} > 0)); then
		if wait_ready "$deadline" "${members[@]}"; then
			cluster_up "$deadline" || rc=1
		else
			rc=1
		fi
	fi
	if ((${#started[@]} > 0)); then
		wait_ready "$deadline" "${started[@]}" || rc=1
	fi
	((rc == 0)) || exit 1
	print_env
}

cmd_stop() {
	[[ $# -gt 0 ]] || die "stop: name an instance (or use down)"
	local names n
	mapfile -t names < <(expand "$@")
	lock
	stop_many "${names[@]}"
}

# stop_many NAME...: stop in parallel, except the members of the etcd cluster: stopped one by
# one, each leader hands over to a live member at once; when its peers are already gone it
# waits about 7 s for a leader transfer that cannot happen.
stop_many() {
	local n cluster=()
	for n in "$@"; do
		if [[ $n == etcd-c* ]]; then
			cluster+=("$n")
		else
			stop_one "$n" &
		fi
	done
	if ((${#cluster[@]} > 0)); then
		for n in "${cluster[@]}"; do stop_one "$n"; done &
	fi
	wait
}

cmd_down() {
	lock
	local n names=()
	for n in $(expand all secure); do
		[[ -e $(idir "$n")/pid ]] && names+=("$n")
	done
	if ((${#names[@]} == 0)); then
		log "nothing running"
		return 0
	fi
	stop_many "${names[@]}"
}

cmd_status() {
	local names n rc=0 state
	mapfile -t names < <(expand "${@:-all}")
	for n in "${names[@]}"; do
		if ready "$n"; then
			state=up
			if ! running "$n"; then state="up (not started by this script)"; fi
		elif [[ $n == redis-c* ]] && running "$n" && answers "$n"; then
			state="down (answers, cluster_state:$(cluster_field "$n" cluster_state || echo '?'))"
			rc=3
		elif running "$n"; then
			state="down (pid $(pid_of "$n") runs but does not answer)"
			rc=3
		else
			state=down
			rc=3
		fi
		printf '%-16s 127.0.0.1:%-6s %s\n' "$n" "$(port "$n")" "$state"
	done
	return $rc
}

cmd_clean() {
	cmd_down
	local n
	rm -rf "$DIR/certs"
	for n in $(expand all secure); do
		local d=$DIR/$n
		if [[ -L $d ]]; then
			rm -rf "$(readlink -f "$d")"
		fi
		rm -rf "$d"
	done
	rm -f "$DIR/apt.log"
	log "removed the data dirs under $DIR"
}

main() {
	local cmd=${1:-}
	[[ $# -gt 0 ]] && shift
	case $cmd in
	up | start | stop | down | status | clean | logs | env) ;;
	-h | --help | help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		return 0
		;;
	*) die "usage: $0 up|down|status|start NAME|stop NAME|env|logs NAME|clean (see --help)" ;;
	esac
	prepare_dir
	case $cmd in
	up) cmd_up "$@" ;;
	start)
		[[ $# -gt 0 ]] || die "start: name an instance (or use up)"
		cmd_up "$@" >/dev/null
		;;
	stop) cmd_stop "$@" ;;
	down) cmd_down ;;
	status) cmd_status "$@" ;;
	clean) cmd_clean ;;
	env) print_env ;;
	logs)
		if [[ $# -ne 1 ]] || ! kind "$1" >/dev/null; then die "logs: name one instance"; fi
		tail -n "${LINES_TAIL:-50}" "$(idir "$1")/server.log"
		;;
	esac
}

main "$@"
