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
// entry ahead, semaphores and read-write locks too; the fence is the
// creation revision of the holder's entry, from etcd's global revision, so
// it only grows, and a released name leaves nothing behind (but a
// semaphore's limit set by Resize, until Resize 0); every acquisition is a
// disk-synced write on a consensus store. Limits: locks live as long as
// their client's lease, whose TTL is whole seconds and at least the
// server's minimum (2s by default), so locker.AutoRefresh(false) does not
// expire a lock, and losing the lease loses every lock of the client at
// once; a revoked lease or a deleted entry is noticed within TTL/3 and two
// round trips.
//
// How it works (the queue, waiting, store failures, sessions, lock-delay,
// inspecting, logging) is in docs/backends/etcdlock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/etcdlock.md
//
// # URL parameters
//
//	tls=true, ca=FILE, cert=FILE, key=FILE, server_name=NAME, skip_verify=true
//	                         TLS, as every backend reads it (backend.Params.TLS);
//	                         server_name is checked whatever name gRPC dials
//	dial_timeout=5s          how long Open waits for the cluster to answer
//	keepalive_time=10s       ping a silent server after this long while a request is in flight (at least 10s; 0: never)
//	keepalive_timeout=5s     and drop the connection, and dial again, if the ping is not answered within this
//	namespace=, ttl=         the locker Client's own, with every scheme
//
// # Security
//
// A client certificate alone (no user) authenticates as its common name; a
// user named with no password found is refused before any connection. A
// wrong password, an unknown user and a missing permission wrap
// backend.ErrPermission and are never retried. The driver needs readwrite
// on prefix/ only (Open checks it). Handshake errors, the least-privilege
// role and what a writer of the prefix can do are in the same document.
package etcdlock
