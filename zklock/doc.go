// Package zklock is the ZooKeeper backend of package locker: the lock
// recipe of ZooKeeper's documentation and Curator's InterProcessMutex, with
// a context, try-lock, fencing tokens, a lost-lock signal and recovery
// from a lost create response.
//
//	import _ "github.com/lockerhq/locker/zklock"
//
//	c, err := locker.Open(ctx, "zk://user:secret@zk1:2181,zk2:2181,zk3:2181/locks?session_timeout=10s")
//
// With a connection of your own, make the driver with [New] (authenticate
// the connection yourself, and pass [WithACL]) and pass it to locker.New;
// [Open] and [Dial] connect their own.
//
// Guarantees: waiters queue in arrival order (FIFO) with no herd, each
// watching the nodes just ahead; the fence is the creation zxid of the
// holder's node, which grows across the ensemble's life; a holder whose
// node someone deletes is told within a round trip (10 ms and a round trip
// in the lock's first 10 ms); semaphores and read-write locks, FIFO too. Limits: a lock lasts exactly as long as the
// driver's session, so every lock of a driver has one TTL, the session
// timeout the server negotiated (by default the Client's default TTL,
// clamped into the server's bounds); a holder cut off from the ensemble
// is told at its last answered request plus the session timeout, less a
// clock margin, and a longer process pause can overrun that: use the
// fence. See What it cannot promise.
//
// How it works, in full (the recipe, fencing, retention, sessions and
// TTLs, semaphores, inspecting, logging, ACLs in detail) is in the
// repository's docs/backends/zklock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/zklock.md
//
// # URL
//
//	zk://[user:password@]host1:2181[,host2:2181...][/root][?session_timeout=10s&connect_timeout=5s]
//	zk://user:password@zk1:2281/locks?ca=/etc/zk/ca.pem&cert=/etc/zk/client.pem&key=/etc/zk/client-key.pem
//
// The path is the root node under which the locks live (default /locker);
// Open creates it when missing. session_timeout is the session timeout the
// driver asks for: without it, the Client's default lock TTL when one is
// set (locker.Open's ttl= or locker.WithDefaultTTL, which lockctl sets
// from --ttl), else 10 s (see Sessions and TTLs in docs/backends/zklock.md);
// connect_timeout bounds Open's wait for a session. A user and password
// authenticate with the digest scheme (see Security).
//
// TLS (the server's secureClientPort) takes the parameters every backend
// reads: tls=true, ca=FILE (PEM), cert=FILE and key=FILE (a client
// certificate, for ssl.clientAuth=need), server_name=NAME, skip_verify=true.
// Any of them turns TLS on. A server that refuses the client certificate
// fails Open at once with an error wrapping backend.ErrPermission and the
// TLS alert; a server certificate that does not verify fails it at once
// with x509's reason; plaintext against a TLS port fails at the connect
// timeout, saying that the server closed the connection unanswered.
//
// # Security
//
// Credentials: digest authentication with the URL's user and password
// (zk://user:password@host...), or [WithDigestAuth] in code; no
// environment variable is read. Nodes the driver makes get "all
// permissions for this credential, read for everyone" ([DigestACL];
// another with [WithACL]); clients sharing a lock name must share the
// credential. Open proves, in one transaction it rolls back, that the
// credential may CREATE, WRITE, DELETE and READ under the root, and fails
// with an error wrapping backend.ErrPermission that names what is missing,
// on which node, and the fix; a root or name node someone else made with
// another ACL is refused the same way. The least-privilege setup and what
// a principal with or without the credential can do are in
// docs/backends/zklock.md (ACLs).
//
// # What it cannot promise
//
// ZooKeeper's guarantees are the session's: a holder partitioned from the
// ensemble keeps believing it holds the lock until its driver declares it
// lost, a session timeout less the clock margin after it sent its latest
// request that the server answered, while the server may expire the
// session, and grant the lock to another, a session timeout after the
// last request it received, which is later. The margin assumes the
// server's clock runs at most 1% faster than the client's; a paused
// process (GC, swap) can overrun it: use the fence. With a connection
// passed to New, the driver learns of an expired session only by polling
// the connection (every tenth of the timeout, at most a second) or when a
// request finds a new session, and Close cannot interrupt calls on that
// connection: they end with the zk client's own timeouts.
package zklock
