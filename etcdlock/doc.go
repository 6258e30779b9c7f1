// Package etcdlock is the etcd backend of package locker: leases, a fair
// queue in creation-revision order, and watches instead of polling.
//
//	import _ "github.com/lockerhq/locker/etcdlock"
//
//	c, err := locker.Open(ctx, "etcd://locker@10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks")
//
//	etcd://[user[:password]@]host[:port][,host[:port]...][/prefix][?params]
//
// The path is the key prefix (default /locker); the password comes from the
// URL or, for a user named without one, from ETCD_PASSWORD ([PasswordEnv]).
// With a client of your own, make the driver with [New] (and [WithPrefix];
// [ClientConfig] turns a URL into a client configuration) and pass it to
// locker.New; [Open] dials its own.
//
// Guarantees: waiters queue in arrival order (FIFO), each watching only the
// entry ahead; the fence is the creation revision of the holder's entry,
// from etcd's global revision, so it only grows and a released name leaves
// nothing behind; every acquisition is a disk-synced write on a consensus
// store; semaphores and read-write locks, FIFO too. Limits: locks live as
// long as their client's lease, whose TTL is whole seconds and at least the
// server's minimum (2s by default), so locker.AutoRefresh(false) does not
// expire a lock, and losing the lease loses every lock of the client at
// once; a revoked lease or a deleted entry is noticed within TTL/3 and two
// round trips.
//
// How it works, in full (the queue, waiting, store failures, sessions,
// inspecting, logging) is in the repository's docs/backends/etcdlock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/etcdlock.md
//
// # URL parameters
//
//	tls=true, ca=FILE, cert=FILE, key=FILE, server_name=NAME, skip_verify=true   TLS (see Security)
//	dial_timeout=5s          how long Open waits for the cluster to answer
//	keepalive_time=10s       ping a silent server after this long while a request is in flight (0: never)
//	keepalive_timeout=5s     and drop the connection if the ping is not answered within this
//	namespace=, ttl=         the locker Client's own, with every scheme
//
// See [Open] for the endpoint forms.
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
