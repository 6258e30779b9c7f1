// Package etcdlock is the etcd backend of package locker: leases, a fair
// queue in creation-revision order, and watches instead of polling.
//
// Import it for its side effect to make locker.Open accept etcd URLs:
//
//	import _ "github.com/lockerhq/locker/etcdlock"
//
//	c, err := locker.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks")
//
// or build the driver from a client you already have:
//
//	drv, err := etcdlock.New(cli, etcdlock.WithPrefix("/locks"))
//	...
//	c, err := locker.New(drv)
//
// # How locks are stored
//
// A lock on key k is a queue: the directory <prefix>/<backend.EscapeKey(k)>/.
// Every acquisition puts one entry there, <lease ID in hex>-<slot>, attached
// to its client's lease; the slot is the lowest number not in use by another
// acquisition of the same name by the same client, so a client that takes a
// lock again and again reuses one key rather than leaving a trail of deleted
// keys that etcd's index keeps (and that every range over the queue would
// walk) until the next compaction. The entry with the lowest creation
// revision holds the lock; the others wait, each watching only the entry just
// ahead of it. The escaped key contains no '/', so the queues of names such
// as "a" and "a/b" never overlap. Tokens never reach the store: the driver
// maps each held token to its entry.
//
// A try-acquire writes its entry only if the directory is empty (one
// transaction, a range comparison), so a failed try leaves nothing behind.
// The fencing token is the creation revision of the holder's entry: etcd
// revisions only grow, and a waiter is granted the lock only when no entry
// older than its own is left, so fences grow in grant order. Release deletes
// the entry by its key, whose name (the lease's id and a slot the driver
// keeps reserved until the key is known gone) no other acquisition uses,
// and reads the deleted entry's creation revision: ErrNotHeld unless it
// was still the fence.
//
// # Waiting
//
// A waiter writes its entry and reads the entry just ahead in one
// transaction, then watches that entry alone (no thundering herd). The watch
// starts at the server's current revision, because etcd serves watches that
// start in the past from a loop that runs every 100 ms, which would stall
// every hand-off (this is what slows concurrency.Mutex down under
// contention); a deletion between the read and the watch's start is caught
// by one read once the watch exists. When the entry ahead goes, one
// linearizable read checks that the waiter's own entry still exists (so its
// lease is alive: etcd's own Mutex once granted locks after the session had
// expired) and that nothing older is left. A waiter whose lease is lost
// queues again, at the back, with a new lease; a cancelled waiter deletes
// its entry before it returns.
//
// # Semaphores and read-write locks
//
// Each name's semaphore and read-write lock is a queue like the lock's, in
// its own directories (<escaped>%s/; <escaped>%r/r/ and %r/w/), entries on
// the session lease, fence their creation revision. A permit holds while
// fewer than limit entries are older (one under another limit is
// ErrLimitMismatch), a reader while no older writer's is, a writer while no
// older entry is. FIFO: a waiting writer keeps later readers out. A
// permit's waiter counts the deletions of older entries in a watch of the
// directory, and reads again once fewer than limit are left.
//
// # Store failures
//
// Every transaction and lease grant is cut when an attempt has had no
// answer for 2s (2.25s at most: one ticker per driver cuts them, so that no
// request carries a deadline; the client waits for a connection rather
// than failing at once, so an unreachable cluster shows as an attempt that
// gets no answer) and sent again, with backoff,
// while etcd does not answer, has no leader or cannot serve it for now,
// until every attempt has failed for backend.StoreFailureBudget (the
// module's one retry policy, internal/retry). A blocking Acquire counts one
// run of failures across all its requests (its lease, its entry, its
// reads), so it rides out an outage shorter than the budget and returns
// the store's error once the budget is spent, at most one attempt later. A
// waiter learns of the outage at once: the etcd client resumes a broken
// watch silently, so the driver watches its gRPC connection and, when it
// goes down, every waiter checks its place in the queue (those requests
// fail, and count). A silent partition, which leaves the connection up,
// shows later: a client that Open made pings the server after 10s without
// a byte from it while a request or watch is in flight, and drops the
// connection 5s later (keepalive_time, keepalive_timeout; a client given
// to New keeps its own settings), which the waiters see as above; else
// when the waiter's lease ends, a TTL after its last keep-alive got
// through, and the waiter queues again. With several endpoints, the
// requests go to the others meanwhile. A waiter that gives up leaves its entry to the
// driver's background sweep, which deletes it once etcd answers again;
// at worst the entry goes with its lease, a lease TTL after the last
// keep-alive. A refused credential or permission (ErrPermission) is
// returned at once.
//
// # What a name leaves behind
//
// Nothing: a name's only state is its queue entries, and a release deletes
// the holder's entry, in its one transaction, so no retention applies.
// Fences need no per-name counter because they come from etcd's global
// revision, which only grows: the creation revision of a later entry of
// the name is above every earlier one, whether or not the name was
// forgotten between them. Like every
// deleted key, the entry's past revisions stay in etcd's history until
// the cluster compacts it (--auto-compaction-retention); reusing one key
// per client and name (the slot above) keeps that history small.
//
// # Sessions
//
// A driver keeps one lease per effective TTL (in practice one per client: a
// Client uses one default TTL), shared by all its locks and waiters, and
// sends it a keep-alive every TTL/3. The lease's TTL is whole seconds, at
// least the server's minimum (etcd raises shorter ones, by default to about
// 2s; the granted TTL is what Grant.TTL reports). When the server says the
// lease is gone (revoked, expired), or no keep-alive succeeded for a whole
// TTL, every lock on the lease reports its loss through Lock.OnLost. After
// each keep-alive (every TTL/3) the driver also checks that the entries of
// its held locks still exist, unmodified since their creation (the driver
// never writes an entry again), so that an entry deleted or overwritten by
// anyone else (an operator's locker.Client.ForceRelease, a hand-made
// delete) is reported lost within TTL/3 plus two round trips. It does not
// watch each held entry: a watch per lock made an uncontended
// acquire+release about a quarter slower.
//
// Locks live as long as their lease: Lock.Refresh checks the entry and
// sends a keep-alive, and locker.AutoRefresh(false) does not make a lock
// expire on its own. Closing the driver revokes its leases, which frees all
// its locks at once. A lease with no lock and no waiter is revoked after a
// minute.
//
// # Inspecting and breaking locks
//
// The driver implements backend.Inspector, backend.Lister and
// backend.Breaker (locker.Client's Inspect, List and ForceRelease). Inspect
// reads the name's directory (one range, entries in creation order) and the
// holder's lease (one TimeToLive): the holder's owner (the entry's value),
// its fence (the entry's creation revision), its time left (the lease's
// remaining TTL on the server, whole seconds rounded down; not reported
// when the lease is about to go or gone) and the queue behind it (every
// other entry's owner, next first). List reads every directory under the
// escaped prefix, in pages of 1000 keys from one revision, and asks each
// holder's lease once. ForceRelease deletes the holder's entry in a
// transaction that compares its creation revision with the fence; the next
// waiter's entry, younger, has a greater revision, and the removed holder's
// driver finds the entry gone at its next check.
//
// # Logging
//
// Open routes the etcd client's log (zap) to the driver's slog logger
// (WithLogger, else the logger in Open's context, which locker.Open sets
// from locker.WithLogger): its warnings (a failed request it retries, a
// keep-alive in trouble) at Warn, its chatter (each request) at Debug, with
// their fields as attributes. A client given to New logs where its
// Config.Logger says.
//
// # Security
//
// TLS comes from the URL: ca=FILE (the CA that signed the server's
// certificate), cert=FILE and key=FILE (a client certificate, for a server
// run with --client-cert-auth), server_name=NAME (checked whatever address
// gRPC dials), tls=true (TLS with the system's roots), skip_verify=true
// (loud: it is logged as a warning). A failed handshake is reported with its
// cause (an unknown authority, a rejected or missing client certificate, a
// plaintext client on a TLS port), found by probing the endpoints once gRPC
// has given up with a bare deadline; Open fails within dial_timeout plus 1s.
//
// Authentication is a password (etcd://user:password@host, or the user
// alone with the password in ETCD_PASSWORD) or, with auth enabled and no
// user named, the client certificate's common name, which etcd takes as
// the user. A user named with no password found is refused before any
// connection, never silently run as the certificate's identity. A wrong
// password, an unknown user and a missing permission are errors wrapping
// backend.ErrPermission (locker.ErrPermission), returned at once and never
// retried.
//
// Least privilege: the driver's user needs one role with readwrite on the
// key prefix, written with the trailing slash:
//
//	etcdctl role add locker
//	etcdctl role grant-permission --prefix=true locker readwrite /locker/
//	etcdctl user grant-role USER locker
//
// Without the slash (readwrite --prefix /locker) the grant works too but
// also covers every key that starts with /locker, such as /locker-other.
// The driver touches no key outside prefix/, grants and revokes only its
// own leases (etcd checks that the revoker may write the lease's keys), and
// needs no other permission. Open checks the grant cheaply (a read of at
// most one key under the prefix, and a transaction whose put never runs,
// because etcd checks every operation of both branches) and names the
// permission that is missing: read only, write only or another prefix fails
// Open with ErrPermission.
//
// Whoever may write the prefix can delete or overwrite any lock's entry,
// and revoke its holder's lease (the lease ID is in the entry's name), and
// so take the lock; the holder is told (Lock.Lost) by its watch of the
// entry, or at worst by the driver's next check, which follows each
// keep-alive: within TTL/3 of the theft plus two round trips. A principal without write on the prefix
// can neither release, overwrite, steal nor queue, and one without read
// cannot watch or list the lock names.
package etcdlock
