// Package zklock is the ZooKeeper backend of package locker: the lock
// recipe of ZooKeeper's documentation and Curator's InterProcessMutex, with
// a context, try-lock, fencing tokens, a lost-lock signal and recovery
// from a lost create response.
//
//	import _ "github.com/lockerhq/locker/zklock"
//
//	c, err := locker.Open(ctx, "zk://user:secret@zk1:2181,zk2:2181,zk3:2181/locks?session_timeout=10s")
//
// or, with a connection you already have:
//
//	drv, err := zklock.New(conn, zklock.WithRoot("/locks"))
//	c, err := locker.New(drv)
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
// from --ttl), else 10 s (see Sessions and TTLs); connect_timeout bounds
// Open's wait for a session. A
// user and password authenticate with the digest scheme (see ACLs).
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
// # The recipe
//
// Each lock name is one child of the root: the key escaped by
// backend.EscapeKey, so every valid name is one valid node name ('/', '.',
// '..', spaces, control characters and unicode included). That node is a
// container node (ZooKeeper 3.5.3 or later), which the server deletes once
// it is empty (see Retention), so the nodes of released names do not pile
// up.
//
// An acquisition creates an ephemeral sequential node under the name's
// node; the lowest sequence number holds the lock. Waiters are served in
// arrival order (FIFO) without a herd effect: a waiter watches the node
// just ahead of it and the one ahead of that, so a deletion wakes at most
// two waiters. When the second one goes, the waiter lists the queue while
// its predecessor takes the lock, learns that it is next, and takes the
// lock on the news of its predecessor's deletion without listing again:
// a handoff costs the release's write and its notification. TryAcquire
// creates its node and, unless it is first, deletes it again. A cancelled
// or failed acquisition deletes its node before it returns (or, when the
// connection is down, keeps trying in the background for as long as the
// node's session may live).
//
// The node is created in a multi-op together with a write to the parent,
// whose stat in the reply gives the node's creation zxid (the parent's new
// Mzxid: the fence) and the parent's number of children: when it is 1,
// the node is alone and holds the lock. A free lock costs one round trip
// to take and one to release, as a bare create and delete of an ephemeral
// node do. For a name the driver does not know to exist (it remembers up
// to 8192 names it made, checked or used), the one multi-op makes the
// name's node too (a container), after a write to the root whose stat
// carries the transaction's zxid, the fence: a new name also costs one
// round trip, and its node, first under a new parent, needs no listing.
// When the name's node exists already (made by another client, or before
// the driver's restart), that multi-op fails and the usual one follows,
// and a name's node made by another client is checked once for the
// configured ACL: two more round trips, once per name. When the server
// has deleted the empty node of a name the driver remembers, the create
// finds "no node" and the driver makes the name's node again.
//
// Node names carry a hash of the holder's token ("lk-<hash>-<sequence>").
// When a create's response is lost with the connection, the driver finds
// its node again by that hash (a protected create) rather than leaving an
// orphan that would block everyone behind it; and Release and Refresh
// find the token's node by it, so that no token can touch another's node.
//
// # Fencing
//
// Grant.Fence is the creation zxid (Czxid) of the holder's node. zxids grow
// across the whole ensemble for its life, so fences keep increasing even
// when the name's node is deleted and recreated (sequence numbers would
// restart) and across session expiries.
//
// # Retention
//
// A release deletes the holder's queue node at once. The name's node, a
// container, goes when the server next checks its containers: every
// znode.container.checkIntervalMs, a Java system property of the server
// (-Dznode.container.checkIntervalMs=1000; not a zoo.cfg key), 60 s by
// default. That interval is the retention: after it, nothing of a
// released name is left in the store, and the next fence, a later zxid,
// is still above every earlier one. A short interval costs the server a
// scan of its containers per interval, and a name taken again after its
// node went is a new name again (its node made in the acquisition's
// multi-op, above). The server deletes at most
// znode.container.maxPerMinute containers a minute (10,000 by default):
// beyond that many new names a minute, the empty ones wait their turn,
// and the retention grows with the backlog.
//
// # Sessions and TTLs
//
// A Driver has one ZooKeeper session; the zk client keeps it alive with
// pings, and every lock of the driver lives exactly as long as the
// session. The driver implements backend.Session: its SessionTTL is the
// session timeout the server negotiated (it clamps the requested one into
// its [minSessionTimeout, maxSessionTimeout], by default 2 to 20 ticks),
// and package locker schedules no refreshes. go-zookeeper does not expose
// the negotiated timeout: on a connection it opens, the driver takes it
// from the zk client's report of the handshake to its logger, else from
// the server's "cons" four-letter word, else it assumes the one it asked
// for; with New, it is WithSessionTimeout's, else the server's "cons"
// answer (see New).
//
// The session timeout is what a crashed holder costs the others: its locks
// go when the server expires its session. So that it means what a TTL
// means on other backends, locker.Open asks for the Client's default TTL
// as the session timeout when the URL sets no session_timeout (zk://...?ttl=2s,
// locker.WithDefaultTTL, lockctl's --ttl); the server clamps it into its
// bounds (a 500 ms request gets 2 ticks), and SessionTTL and Lock.TTL
// report what it granted. A timeout cut to the server's maximum is logged
// at Warn: Lock.TTL then still reports the longer TTL (see below), but a
// crashed holder keeps others out only for the session timeout.
// session_timeout, when set, wins.
//
// A lock's TTL cannot be set per lock: the session's governs every lock of
// the driver. Grant.TTL reports the session timeout when it is longer than
// the requested TTL, and the requested TTL when that is longer (the lock
// lives as long as the session, so it outlives any TTL while the client is
// alive); a lock asked for with a TTL other than the session's is still
// held exactly as long as the session lives, and freed a session timeout
// after the holder's last contact. Refresh only checks that the lock is
// still held.
//
// A disconnect means "maybe lost": the zk client resumes the session on
// any server of the ensemble, and the locks are kept. The lock is reported
// lost (Lock.OnLost, hence locker's Lost channel and Do's context) when
// the session expires, which the driver learns when it reconnects, or at
// the session's deadline: when the driver sent the latest request on the
// session that the server answered (Grant.Contact), plus the session
// timeout, less backend.ClockMargin (a hundredth of it and 2 ms). The
// server expires the session a timeout after the last request it
// received, which it received no earlier than the driver sent it; watch
// events and other bytes the server sends unasked do not count, since
// they say nothing of when it last heard from the driver. To keep the
// contact fresh on a quiet connection, the driver reads the root node
// (Exists) every quarter of the timeout, and 50 ms after the zk client
// has a session again following a reconnection. A waiter whose session
// expires gets an error wrapping ErrSessionExpired, and its node is gone
// with the session. A lock reported lost at its deadline may still have
// its node, when the server did not expire the session after all (a
// paused server, resumed, may take the session's reconnection before it
// expires it; answers may be late): its holder was told, so the driver
// deletes the node as soon as the connection allows, and the waiters
// behind it go on.
//
// A waiter (Acquire) rides out store failures: while the connection is
// down it keeps its place (its node lives as long as the session), and it
// returns the store's error only once every try, and the connection, has
// failed for backend.StoreFailureBudget; a refusal (ErrPermission) ends it
// at once. When its session expired meanwhile (its node went with it), it
// queues again on the new session, at the back. Before it reports a lock
// taken on a notification that came with a reconnection, it reads its node
// once, so that the lock is timed from a request the server answered.
//
// A waiter whose context ends returns within 100 ms and one round trip,
// connection dead or alive; when its queue node could not be deleted by
// then, the driver keeps deleting it in the background for as long as
// the session may live. On a connection the driver dialed, a call's
// requests (the queue node's create, a release's delete, a waiter's
// listing and watch) are sent from the caller's goroutine while the zk
// client has a session; when the call's context ends and the server has
// not answered 50 ms later, the driver cuts the connection's blocked
// read: the zk client reconnects, the session and its locks live on, and
// other requests in flight on that connection fail as on any disconnect
// and are retried. Close returns within 2 seconds, connection dead
// or alive: on its own connection it sends the close request (which frees
// the locks at once), gives the server a second to answer, then cuts the
// connection; no goroutine of the driver or of the zk client is left.
//
// # Semaphores and read-write locks
//
// The driver implements backend.Modal (locker.Semaphore, Read and Write),
// as Curator's InterProcessSemaphoreV2 and InterProcessReadWriteLock do,
// on the lock's queue code: a name's semaphore and read-write lock are
// queues of their own, container nodes "sem~NAME" and "rw~NAME" beside the
// lock's (no lock's escaped name holds a '~', so Inspect and List never
// see them), of ephemeral sequential nodes tagged "p<limit>", "r" or "w".
// A permit holds while its node is among the first limit nodes, a reader
// while no writer's node is ahead of it, a writer while it is first:
// waiters are served in arrival order (FIFO), so a writer waits only for
// the readers ahead of it. The fence is the node's creation zxid, as for a
// lock. A permit asked with another limit than the queue's first node's
// fails with ErrLimitMismatch and deletes its node. A waiting writer
// watches the node ahead of it, a reader the nearest writer ahead of it,
// and a semaphore's waiter the queue's children (any node ahead that goes
// may free a permit: a release wakes every waiter of that semaphore).
//
// # Inspecting and breaking locks
//
// The driver implements backend.Inspector, backend.Lister and
// backend.Breaker (locker.Client's Inspect, List and ForceRelease). Inspect
// lists the name's queue and reads each node: the holder (the first node)
// with its owner (the node's data) and fence (its creation zxid), and the
// waiters' owners, next first. It reports no time left: a node has no
// expiry of its own, and the holder's session (its timeout, its last
// contact) is known only to the server it is connected to. A waiter's
// node made by a TryAcquire that is about to delete it again may show in
// the queue for a round trip. List lists the root, whose children are the
// escaped names, then reads each matching name's queue. ForceRelease reads
// the queue's first node and deletes it, with the version read, if its
// creation zxid is the fence (a sequential node's name is never reused);
// the next node in line has a greater zxid, and the removed holder's
// driver sees the deletion on its watch of the node.
//
// # Logging
//
// A driver that dials its own connection (Open, Dial) routes
// go-zookeeper's messages to its slog logger (WithLogger, else Open's
// context's, which locker.Open sets from locker.WithLogger) at Debug:
// nothing reaches stderr. A connection given to New logs where zk.Connect
// was told (go-zookeeper's default writes to stderr through package log):
// connect it with zk.WithLogger(zklock.Logger(l)).
//
// # ACLs
//
// With a user and password (the URL's userinfo, or WithDigestAuth), the
// driver authenticates with the digest scheme and creates every node with
// the ACL "all permissions for this credential, read for everyone": others
// can see who holds a lock but cannot create nodes in its queue nor delete
// the holder's node (ZooKeeper checks a delete against the parent's ACL,
// which is the same). Clients sharing a lock name must share the
// credential. With New, authenticate the connection yourself and pass the
// ACL with WithACL (DigestACL builds it).
//
// Least privilege: the driver gives every node it makes (the root when it
// makes it, the names' nodes, the queue nodes) the configured ACL, and
// refuses a root or name node made by someone else unless it carries that
// ACL exactly. Locking needs, for the driver's identity, CREATE (the names'
// nodes under the root, the queue nodes under a name's), WRITE (the
// create's transaction writes the name's node, or for a new name the root,
// to read the fence), DELETE
// (its own queue node) and READ (listing and watching the queue, reading
// the root's ACL). ADMIN is not needed. So the least-privilege setup is a
// root the administrator makes with
//
//	zkCli: create /locks "" digest:locker:<base64 sha1 of locker:password>:cdrw
//
// and a driver opened with the same ACL:
//
//	WithDigestAuth("locker", pw), WithACL(zk.DigestACL(zk.PermCreate|zk.PermDelete|zk.PermRead|zk.PermWrite, "locker", pw))
//
// (the URL's default is DigestACL: cdrwa for the credential and read for
// everyone, so a root made for a URL carries
// digest:locker:<hash>:cdrwa,world:anyone:r). Without READ or ADMIN on a
// node, ZooKeeper shows a digest id's hash as "x"; the driver then matches
// it by user and proves the password by what it may do.
//
// Open checks all of this before it returns, in one round trip that
// changes nothing: a transaction that makes a probe node under the root
// and a child of it, writes the probe, deletes the child and ends with a
// version check that fails, so the server rolls it back (acl.go). A
// permission missing, a wrong password (the server does not grant what the
// root's ACL grants the configured digest user) or a root whose ACL differs
// from the configured one fail Open with an error wrapping
// backend.ErrPermission that says which permission, on which node, or
// what to fix. A root that does not exist cannot tell a password wrong:
// Open creates it with the ACL of the first credential it sees. Later
// refusals (an ACL changed after Open) are ErrPermission too, never
// retried.
//
// A principal holding the credential can do anything the driver can:
// queue, take a free lock, and delete any queue node, the holder's
// included. One without it (no digest, or another user; a valid TLS client
// certificate adds only an x509 identity, which the ACL does not name) can
// list the queues and read who holds a lock (world read, with the default
// ACL; nothing with the least-privilege one), and can neither queue, nor
// delete or overwrite a node.
//
// A root or name node that existed before the driver needed it (someone
// made it with zkCli, whose default ACL is world-writable) must carry the
// configured ACL exactly: otherwise Dial, New or the first acquisition of
// that name fails with an error wrapping backend.ErrPermission that names
// the node, its ACL and the fix (acl.go). And a holder whose node someone
// still deletes or overwrites (an operator, the super user, another
// process with the credential) is told at once: the driver watches the
// nodes it holds (theft.go), and the lost signal fires when the server's
// notification arrives, a round trip after the change (about 2 ms on
// loopback). The watch is set once a lock has been held for 10 ms, so that
// a short hold costs no more than the create and the delete: a change in
// those first 10 ms is reported when the watch is set, 10 ms and a round
// trip after the grant at most (and Release reports a node found gone).
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
