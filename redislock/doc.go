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
// with [New], [NewFair] or [NewQuorum] and pass it to locker.New; [Open],
// [OpenFair] and [OpenQuorum] dial their own. fair=true opens a
// [FairDriver]: strictly first come, first served.
//
// Guarantees: release and refresh are token-checked scripts; fences
// increase per name (max(counter+1, server clock in µs)); blocked waiters
// queue in the server and a release hands the lock to the first; refreshes
// are batched, one pipeline per server; semaphores and read-write locks in
// every mode but the quorum. Limits: Redis keeps locks in memory and
// replicates them asynchronously, so a failover or an eviction can let a
// second holder in before the first learns it at its next refresh: pass
// the fence to what you protect (see What Redis cannot promise). Needs
// Redis 5.0 or newer, or a compatible server such as Valkey.
//
// How it works, in full (keys, scripts, the hand-off, fair mode, the
// quorum, cancellation, logging, least privilege) is in the repository's
// docs/backends/redislock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/redislock.md
//
// # URL parameters
//
//	fair=true              a FairDriver (not with +quorum)
//	restart_delay=D        cap the wait of a restarted server (0: off; see below)
//	retention=24h          how long a name's fence counter outlives its last grant
//	ca=, cert=, key=, server_name=, skip_verify=   TLS (see Security)
//	namespace=, ttl=       the locker Client's own, with every scheme
//
// and go-redis's own query parameters (dial_timeout=3s, read_timeout=1s,
// pool_size=20, max_retries=2, client_name=...; see redis.ParseURL and
// redis.ParseClusterURL); an unknown one is an error wrapping
// locker.ErrInvalidURL. The cluster form also takes go-redis's
// addr=host:port parameter for more seed nodes. Multi-host forms cannot
// list IPv6 literals; build the clients and call [NewQuorum] or [New]. The
// Close of a driver from New, NewFair or NewQuorum leaves your clients
// open.
//
// # Security
//
// TLS: rediss://, or redis:// with any TLS parameter: ca=FILE (the CA that
// signed the server's certificate), cert=FILE and key=FILE (a client
// certificate, for tls-auth-clients yes), server_name=NAME (the name the
// server's certificate must carry; default: the host dialed),
// skip_verify=true (tests only; logged). A refused handshake is named in
// Open's error ("tls: unknown certificate authority", "tls: certificate
// required", "x509: ...").
//
// Credentials: ACL user and password in the URL
// (rediss://user:password@host:port/0; lockctl substitutes ${VAR}); no
// environment variable is read. A
// wrong password, an unknown or disabled user, a missing AUTH (NOAUTH) and
// a command or key the ACL refuses, outside a script or in one, are
// locker.ErrPermission, at Open or at the first call, never retried. A URL
// that names a user but no password is refused before connecting
// (ErrInvalidURL): go-redis would skip AUTH and run as the default user,
// and Redis has no identity by client certificate.
//
// The least Redis 7 ACL for a namespace is what [ACL] returns (and
// [SharedACL] adds for semaphores and read-write locks); the rules, and
// what a missing one costs, are in docs/backends/redislock.md.
//
// # What Redis cannot promise
//
// Redis keeps locks in memory and replicates them asynchronously, so:
//
//   - A failover to a replica that had not yet received the lock key loses
//     the lock: a second client can acquire it while the first still holds
//     it. The first learns it at its next refresh (a third of the TTL), not
//     before. (WAIT after acquiring narrows the window; it does not close it.)
//   - A restart without persistence loses every lock, but grants none of
//     them twice: the acquire script refuses a name whose fence counter is
//     missing while the server has run for less than the lock's TTL
//     (Redlock's "delayed restart", by the server's own uptime), so the
//     holders it forgot are told first. A name's first use on a new server
//     waits the same way. [WithRestartDelay] (URL: restart_delay=) caps
//     the wait; 0 turns it off, for servers run with appendonly yes and
//     appendfsync always.
//   - A large jump of a server's clock shortens a lease: Redis expires keys
//     by its own wall clock, so a lock may end before its TTL is up.
//     Quorum mode tolerates it on a minority of servers; the drift
//     allowance covers clocks that run fast, not clocks that are stepped.
//   - Eviction (any maxmemory-policy but noeviction) can delete a lock key
//     at any time.
//   - A release whose reply is lost and which go-redis then retries reports
//     ErrNotHeld although it released the lock (an acquisition retried that
//     way is recognised: the script is idempotent for one attempt).
//
// In all these cases two holders can briefly overlap. The mitigation is the
// fencing token: pass Lock.Fence() to the protected resource and have it
// reject writes with a fence lower than one it has seen. Fences keep
// increasing across such failovers and restarts (see "Fences and retention" in
// docs/backends/redislock.md), so the resource can tell the new holder from the old one.
package redislock
