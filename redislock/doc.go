// Package redislock is the Redis backend of package locker: a Redis server,
// a Redis Cluster or a ring through go-redis, or a quorum of independent
// servers (the Redlock algorithm).
//
// # URLs
//
// A blank import registers these schemes with locker.Open:
//
//	redis://[user:password@]host:port/db[?options]        one server (or a proxy)
//	rediss://[user:password@]host:port/db[?options]       the same over TLS
//	redis+cluster://[user:password@]host:port,host:port[?options]   Redis Cluster
//	rediss+cluster://...                                  the same over TLS
//	redis+quorum://[user:password@]host:port,host:port,host:port/db[?options]
//	rediss+quorum://...                                   Redlock over TLS
//
// fair=true (not with +quorum) opens a [FairDriver]: see Fair mode.
//
// The options are go-redis's own query parameters (dial_timeout=3s,
// read_timeout=1s, pool_size=20, max_retries=2, client_name=..., skip_verify
// for rediss; see redis.ParseURL and redis.ParseClusterURL); an unknown one
// is an error wrapping locker.ErrInvalidURL. The cluster form also takes
// go-redis's addr=host:port parameter for more seed nodes. Multi-host forms
// cannot list IPv6 literals; build the clients and call [NewQuorum] or [New].
// locker.Open's own namespace and ttl parameters work with every scheme.
//
// With a client you already have (any redis.UniversalClient: *redis.Client,
// *redis.ClusterClient, *redis.Ring, a failover client), call [New]; for a
// quorum, [NewQuorum]. Their Close leaves your clients open.
//
// Redis 5.0 or newer (or a compatible server with Lua scripting and
// effects replication, such as Valkey) is required: the acquire script reads
// the server clock after writing.
//
// # How it works
//
// A lock is a string key holding the holder's random token, with a TTL:
// SET NX PX in a Lua script that, in the same atomic step, advances the
// name's fencing counter (INCR), so the lock and its fence never disagree.
// Refresh (PEXPIRE) and release (DEL) are Lua scripts that first compare
// the token, so a holder can never touch another holder's lock. The scripts
// are embedded and sent with EVALSHA, falling back to EVAL when a restart or
// failover emptied the server's script cache. TTLs are in milliseconds
// (PX): a TTL is rounded up to whole milliseconds, at least 1ms.
//
// Every driver implements backend.BatchRefresher: RefreshMany sends the
// refresh script for many locks in one pipeline (go-redis splits a
// cluster's by node), and a Quorum one pipeline per server, the servers in
// parallel, judging each lock as Refresh does. So the locks a Client holds
// cost round trips per batch, not per lock, and no goroutine per lock.
//
// Keys: for the lock key K (namespace/name), the lock is "{E}:lock" and its
// fence counter "{E}:fence", where E is backend.EscapeKey(K). The {E} hash
// tag keeps both in one Redis Cluster slot. The lock key's value is
// "<token>.<n>:<fence>:<owner>": the holder's token and which attempt of
// it set the key, so that cleaning up after a failed attempt never removes
// a later attempt's key; then the grant's fence and the holder's
// locker.Owner ("" without one), written by the acquire script itself, at
// no extra round trip, for operators.
//
// # Inspect, List, ForceRelease
//
// Every driver implements backend.Inspector, backend.Lister and
// backend.Breaker (locker's Client.Inspect, List and ForceRelease):
//
//   - Inspect runs one read-only script: the holder's owner, fence and time
//     left (PTTL), and the live waiters queued, in queue order, with their
//     owners (a waiter's queue entry is a random ID and its owner; dead
//     entries are not counted). A Quorum keeps no queue: its waiters
//     listen on the release channel and leave no trace, so it reports
//     none.
//   - List SCANs (MATCH "{<escaped prefix>*}:lock", pages of 1000; never
//     KEYS) the server, or every master of a cluster, every shard of a
//     ring, and reads the matching locks' values and PTTLs in one pipeline
//     per page. The key comes back from the key's name (EscapeKey is
//     reversible). List reports owner, fence and TTL, not waiters.
//   - ForceRelease runs one script: it deletes the lock if its value
//     records the given fence, and publishes on the release channel,
//     naming the next waiter, so that it takes over at once. The
//     fence counter stays, so the next grant's fence is higher; the
//     removed holder's next refresh finds its token gone (ErrNotHeld).
//
// A [Quorum] asks every server. Inspect reports the lock held when a
// majority of the servers hold it for the same acquisition under the same
// fence (the granting servers record the acquisition's fence: raised to
// it when they gave a lower one), with the time left on the majority's
// shortest; it fails, rather than guess, when the servers that did not
// answer could decide it. List reports the keys held on a majority, under
// the same rule. ForceRelease deletes the lock on every server whose value
// records the fence, and succeeds when that is a majority (ErrNotHeld
// otherwise; the servers it did delete on stay deleted).
//
// # Logging
//
// go-redis has one logger for the whole process (redis.SetLogger), which
// writes to stderr by default (a pool that cannot dial, a connection left
// with unread data). The first driver this package makes or opens puts in
// its place a logger that hands each go-redis message, at Warn, to the
// loggers of the drivers open at that moment ([WithLogger]; locker.Open
// gives the Client's locker.WithLogger), each logger once however many
// drivers share it; with no such driver open, the message is dropped. A
// driver's logger stops receiving them at its Close. A program that calls
// redis.SetLogger after that takes go-redis's messages back for itself.
//
// Fences and retention: a grant's fence is max(counter + 1, server clock in
// microseconds), computed and stored by the acquire script (the server's
// TIME, so one clock per server whatever the clients' clocks say). The
// counter expires [WithRetention] (URL: retention=; default 24h) after the
// name's last grant, so at most that long after the name's last release
// nothing of it is left on the server: a lock key goes at its release or
// TTL, the counter after the retention, a queue when it empties or 4s
// after its last waiter's last try. Per-entity names (per tenant, per
// order) no longer fill the server. A Cluster cannot keep one counter for
// every name (names live in different slots), hence the clock floor: a
// counter that is gone (expired, or lost by a restart without persistence)
// or stale (a failover to a replica that missed the last writes) starts
// again at the clock, which is above every fence it gave, since each
// fence was at most the clock of its grant (no name is granted a million
// times a second). Assumption: no server's clock steps back by more than
// the retention (for a failover, the new primary's clock is not behind
// the old one's by more than that); for a Quorum, in addition, the
// servers' clocks differ by less than the retention. The floor costs no
// round trip: it is one TIME, and a SET or an INCR plus PEXPIRE, inside
// the acquire script.
//
// Waiting (the default mode): the queue engages only under contention. A
// free lock costs one script, as TryAcquire, and a release with no one
// waiting deletes the key and PUBLISHes on "{E}:released", as before; a
// refused Acquire joins the name's queue and is handed the lock:
//
//   - The queue is the sorted set "{E}:queue" (waiter → arrival time on
//     the server clock), the hash "{E}:live" (waiter → until when it is
//     alive) and the hash "{E}:hand" (waiter → the lock value and TTL of
//     its latest try). Waiters are named by a random ID and their owner,
//     never by their token. A waiter renews its entry on every try, at
//     least every TTL/4 (2s/3 at most, 5ms at least), each try with a new
//     attempt number.
//   - A release with live waiters does not delete the key: in the same
//     script it writes the first live waiter's value, a new fence and that
//     waiter's TTL, and publishes "!<attempt>:<fence>:<waiter>". The
//     waiter holds the lock from then on, without a round trip: it trusts
//     the message only for the attempt of its latest try that the server
//     answered "queued", which was sent before the release ran, so the
//     lock's TTL counted from that try's sending ends no later than the
//     server's (the Grant's Sent: at most TTL/4 and a round trip before
//     the hand-off). A lost message costs the waiter until its next
//     renewal: that try finds the lock held by an
//     earlier attempt of its token and takes it over (a new fence). A
//     waiter of the releasing process learns it from the release's reply.
//   - The key is never free while live waiters are queued, so a newcomer's
//     try (and TryAcquire) fails: blocked waiters are served in arrival
//     order (the suite's FIFO cases pass). Not strictly: a lock whose
//     holder's TTL ran out is free, and goes to whoever tries first (the
//     queue's head tries again when that TTL runs out).
//   - A waiter that gives up (its ctx, Close) leaves the queue, and hands
//     on a lock handed to any attempt of its wait (or frees it when no one
//     else waits). A waiter whose process died is skipped once 2s passed
//     since its last renewal; within those 2s a release may hand it the
//     lock, which then stays until that waiter's TTL runs out, counted
//     from the release: the same stall as a holder that died. The
//     waiters behind look again at least every 2s/3.
//
// Only the first waiter is woken by a release, and only by name: a release
// wakes one waiter, whatever their number. A blocked Acquire subscribes
// after its first try (the driver confirms the subscription with a PING
// on the same connection) and tries once more, so that a hand-off before
// the subscription was confirmed is taken over by that try; when the
// channel is still subscribed from a moment before, it subscribes first
// and needs no second try. One pub/sub connection per Driver
// serves all names (per channel on a ring, whose channels live on
// different shards); a channel stays subscribed for a second after its
// last waiter left, so a busy lock pays no SUBSCRIBE per acquisition.
// Plain PUBLISH is used rather than sharded SPUBLISH: it works on every
// Redis version and on a ring, and in a cluster it reaches subscribers on
// any node. The price, in a large cluster, is that each release is
// broadcast over the cluster bus to every node. Pub/sub ignores the
// database number, so applications that share a server but use different
// databases may wake each other's waiters needlessly (one extra attempt).
//
// # Fair mode
//
// The default serves blocked waiters in arrival order, but lets a try take
// a lock that is free while waiters are queued (after a holder's TTL ran
// out). A [FairDriver] ([NewFair], [OpenFair], or fair=true in the URL) is
// strictly first come, first served, like etcd's and ZooKeeper's queues:
//
//   - A blocked Acquire joins the same queue ("{E}:queue", "{E}:live").
//   - The acquire script grants a free lock only to the longest-waiting
//     live waiter (or to anyone when no one waits), so TryAcquire fails
//     while someone is queued even if the lock is momentarily free.
//   - A release deletes the key and names the next waiter in its message,
//     and only that waiter is woken; it then tries (one more round trip
//     than the default's hand-off).
//   - A waiter renews its liveness on every try, at least every 2s/3; a
//     waiter whose process died is dropped when it reaches the head, so it
//     holds the queue up for at most 2s. A waiter that gives up leaves the
//     queue at once (and wakes the next if the lock is free).
//   - The queue's keys expire 4s after the last waiter's renewal: nothing
//     stays behind.
//
// The costs, against the default: every acquire script looks at the
// queue, a hand-off takes one more round trip (the head's try), and a
// lost release message leaves the lock idle until the head's next renewal
// (up to 2s/3). All clients of a name must use the same mode. Quorum mode
// has no queue (see [Quorum]).
//
// # Semaphores and read-write locks
//
// Every Driver (server, Redis Cluster, ring; plain or fair) takes
// locker.Semaphore(n), Read() and Write() (backend.Modal). A name's
// semaphore and read-write lock are objects apart from its lock, in the
// same hash slot: a sorted set of holders, "{E}:sem" or "{E}:rw" (token →
// expiry in server-clock ms, judged by the scripts, not by key TTLs), a
// hash "{E}:sem.h" or "{E}:rw.h" (each holder's attempt and fence; the
// permits' limit; the writer; the waiting writer), and a fence counter of
// its own, "{E}:sem.fence" or "{E}:rw.fence", advanced as the lock's is
// (clock floor, retention; a restarted server refuses an object without
// its counter, as it does a lock). One Lua script per operation prunes
// expired holders, decides and writes; the keys expire with their last
// holder. A release publishes on "{E}:released" and waiters retry.
//
// Both modes queue blocked waiters in arrival order, as fair mode does
// for locks ("{E}:sem.q"/".live", "{E}:rw.q"/".live"):
// a permit is granted while holders and live waiters ahead are fewer than
// the limit, a reader when no writer holds or waits ahead, a writer when
// nothing is held and no one waits ahead; TryAcquire counts every live
// waiter as ahead. Releases, and grants that leave others queued, wake
// every waiter of the key. A [Quorum] takes none of these modes: each
// server would grant n permits to different clients, so a majority bounds
// nothing (n on each of 3 servers of 5 lets 5n/3 clients gather a
// majority). [SharedACL], added to [ACL]'s rules, allows them.
//
// # Cancellation
//
// go-redis never watches a context's cancellation while it reads a reply:
// a call blocked on a dead connection goes on until the client's
// ReadTimeout (3s by default), and longer with its retries. So the clients
// this package dials itself ([Open], [OpenFair], [OpenQuorum], and
// locker.Open) get interruptible connections and ContextTimeoutEnabled:
// when a call's context ends while one of the client's reads that began
// before that is still blocked 50ms later, that read is cut (a read
// deadline of now), go-redis drops the connection, and the call returns;
// a cancelled Acquire returns within about 100ms. The rule spares healthy
// calls on a server that answers within 50ms; on a slower server, another
// caller's call whose read is in progress at the cancel and lasts longer
// may fail with a timeout. Pub/sub reads, which have no deadline, are never
// cut. What the interrupted call may have left (a lock granted after all,
// a queue entry) is undone in the background: the driver sends the
// cleanup at once and waits up to 50ms for it, the locker Client also
// releases by token, and what no one could undo expires (a lock after its
// TTL, a queue entry after 2s).
//
// A client passed to [New], [NewFair] or [NewQuorum] was not dialed by this
// package and its connections cannot be interrupted: there, a call on a
// dead connection returns at the client's ReadTimeout after a cancel, or at
// the context's deadline if the client sets ContextTimeoutEnabled and the
// context has one.
//
// At start, the driver reads maxmemory-policy (on every master of a
// cluster) and logs a warning (see [WithLogger]) unless it is noeviction:
// an evicted lock key is a silently lost lock. A server that refuses CONFIG
// is not an error.
//
// # Quorum (Redlock)
//
// [Quorum] takes the lock on N independent servers (not replicas of each
// other; 3 or 5) and holds it when a majority granted it. Every operation
// returns as soon as a majority has answered: a slow or partitioned
// minority costs nothing, and its late answers are dealt with in the
// background (a late grant of an abandoned attempt is released at once).
// Its minimum TTL is 500ms: shorter leases are raised to it. Each server keeps
// the key for the TTL plus a clock-drift allowance (1% of the TTL plus
// 2ms, see [WithClockDrift]); the lock is valid for the TTL from the moment
// the first request was sent, and an acquisition that took the whole TTL
// fails. Refresh and release go to every server; a failed acquisition
// releases on every server, so nothing stays held. Fences stay strictly
// increasing although each server counts on its own: the fence is the
// highest counter among the granting servers, and before the lock is
// reported held, every granting server's counter is raised to it (the
// argument is on [Quorum]). With servers down, the lock works while a
// majority answers; with fewer, acquisition fails with an error naming the
// unreachable servers. Servers of a URL-opened Quorum do not retry failed
// commands (max_retries=-1 unless the URL sets it): a down server costs one
// vote, not the retries' delay.
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
// (rediss://user:password@host:port/0; lockctl substitutes ${VAR}). A
// wrong password, an unknown or disabled user, a missing AUTH (NOAUTH) and
// a command or key the ACL refuses, outside a script or in one, are
// locker.ErrPermission, at Open or at the first call, never retried. A URL
// that names a user but no password is refused before connecting
// (ErrInvalidURL): go-redis would skip AUTH and run as the default user,
// and Redis has no identity by client certificate.
//
// # Least privilege
//
// [ACL] returns the least Redis 7 ACL for a namespace. For the locker
// package's default namespace "locker":
//
//	ACL SETUSER app on >password resetkeys resetchannels -@all
//	  ~{locker%2F*}:lock ~{locker%2F*}:fence &{locker%2F*}:released
//	  +evalsha +eval +ping +subscribe +unsubscribe
//	  +get +set +pexpire +incr +time +exists +del +info +publish
//	  ~{locker%2F*}:queue ~{locker%2F*}:live
//	  +zrange +zscore +zadd +zrem +hget +hset +hdel
//
// and without fair=true (the default mode's hand-off) ~{locker%2F*}:hand,
// with fair=true +pttl.
//
// Key patterns: every key is hash-tagged, "{" + EscapeKey(namespace + "/"
// + name) + "}:kind", so a pattern such as ~locker/* matches none of them;
// the namespace's '/' is %2F. Channels: Redis 7 gives a new user no
// channel (resetchannels), and a release PUBLISHes on "{...}:released".
// Commands: EVALSHA, and EVAL when the server lacks a script (after a
// restart or failover, and for clean-ups); the commands the scripts call,
// which Redis checks against the user too; INFO for the restart delay
// (needed unless restart_delay=0); PING at Open and to confirm a
// subscription; SUBSCRIBE and UNSUBSCRIBE to wait. Quorum mode needs the
// same on every server. Cluster: the same on every node, and
// +cluster|slots (go-redis reads the slot map with it; refused, Open fails
// with ErrPermission) and +command (go-redis reads the command table once;
// refused, it asks again before every call). A database
// other than 0 needs +select; client_name= needs +client|setname. Not
// needed: CONFIG (the maxmemory-policy check is skipped when refused) and
// CLIENT SETINFO (go-redis ignores its refusal on Redis 7.2 and later).
// Semaphores and read-write locks need SharedACL(namespace, fair) added:
// their keys and +zadd +zrem +zcard +zscore +zrange +zrangebyscore
// +zremrangebyscore +hget +hset +hdel +hexists. An operator's calls need more: Inspect and ForceRelease +pttl (fair mode's
// rules have it), and List +scan and +pttl.
//
// With one of these rules less, the call that needs it fails with
// ErrPermission, except the channel, PUBLISH and SUBSCRIBE: a release whose
// wake-up is refused succeeds (the key is deleted, or handed to the first
// waiter), the driver logs the refusal once, and waiters learn of it at
// their next renewal, every 2s/3. A waiter refused SUBSCRIBE (no
// +subscribe, or no channel rule) tries once per wait and then polls: in
// the default mode with a backoff from 25ms to 250ms, logging once per
// wait that it polls; in fair mode at its renewals. A user with every
// command but no rights to a namespace's keys cannot acquire, refresh or
// release its locks, nor delete their keys.
//
// What a user with the rights can do: anyone who can write a namespace's
// keys can delete or overwrite a held lock. The holder learns it at its
// next refresh, which the locker package's watchdog sends at most TTL/3
// after the one before: its Lost channel fires within TTL/3 and a round
// trip of the theft. Fences keep increasing, so a resource that checks them
// turns the old holder away.
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
// increasing across such failovers and restarts (see Fences and retention
// above), so the resource can tell the new holder from the old one.
package redislock
