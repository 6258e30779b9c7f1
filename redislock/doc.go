// Package redislock is the Redis backend of package locker: one server, a
// Redis Cluster or ring, or a quorum of independent servers (Redlock).
//
//	import _ "github.com/lockerhq/locker/redislock"
//
//	c, err := locker.Open(ctx, "redis://:password@cache:6379/0?namespace=billing")
//
//	redis://[user:password@]host:port/db[?params]                  one server (or a proxy)
//	redis+cluster://[user:password@]host:port,host:port[?params]   Redis Cluster
//	redis+quorum://[user:password@]h1:port,h2:port,h3:port/db      Redlock: a majority of N
//	rediss://, rediss+cluster://, rediss+quorum://                 the same over TLS
//
// With a client of your own (any redis.UniversalClient), make the driver
// with [New], [NewFair] or [NewQuorum]; their Close leaves your clients
// open. [Open], [OpenFair] and [OpenQuorum] dial their own. fair=true
// opens a [FairDriver]: strictly first come, first served.
//
// Guarantees: release and refresh are token-checked scripts; fences
// increase per name (max(counter+1, server clock in µs)); blocked waiters
// queue in the server and a release hands the lock to the first; refreshes
// are batched; semaphores and read-write locks in every mode but the
// quorum. Limits: Redis keeps locks in memory and replicates them
// asynchronously, so a failover, a restart without persistence (see
// [WithRestartDelay]), a stepped server clock or an eviction (any
// maxmemory-policy but noeviction) can let a second holder in before the
// first learns it at its next refresh: pass Lock.Fence() to what you
// protect, which keeps increasing across all of these. Needs Redis 5.0 or
// newer, or a compatible server such as Valkey. How it works, in full:
// https://github.com/lockerhq/locker/blob/main/docs/backends/redislock.md
//
// # URL parameters
//
//	fair=true              a FairDriver (not with +quorum)
//	restart_delay=D        cap the wait of a restarted server (0: off; see WithRestartDelay)
//	retention=24h          how long a name's fence counter outlives its last grant
//	ca=, cert=, key=, server_name=, skip_verify=   TLS (rediss implies it)
//	namespace=, ttl=       the locker Client's own, with every scheme
//
// and go-redis's own (dial_timeout=3s, pool_size=20, max_retries=2, ...;
// see redis.ParseURL and redis.ParseClusterURL, whose addr=host:port adds
// cluster seeds); an unknown one is an error wrapping
// locker.ErrInvalidURL. Multi-host forms cannot list IPv6 literals: build
// the clients and call [NewQuorum] or [New].
//
// # Security
//
// Credentials go in the URL (lockctl substitutes ${VAR}); no environment
// variable is read, and a user without a password is refused
// (ErrInvalidURL). A refused password, user, command or key is
// locker.ErrPermission, never retried. The least Redis 7 ACL for a
// namespace is what [ACL] returns ([SharedACL] adds semaphores and
// read-write locks).
package redislock
