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
// # URL
//
//	zk://[user:password@]host1:2181[,host2:2181...][/root][?session_timeout=10s&connect_timeout=5s]
//
// The path is the root node of the locks (default /locker), made when
// missing; session_timeout defaults to the Client's default lock TTL, else
// 10 s; connect_timeout bounds Open's wait for a session. A user and
// password authenticate with the digest scheme. TLS takes the parameters
// every backend reads: tls=true, ca=, cert=, key=, server_name=,
// skip_verify=true.
//
// # Guarantees and limits
//
// Waiters queue in arrival order (FIFO) with no herd, for semaphores and
// read-write locks too; the fence is the creation zxid of the holder's
// node, which grows across the ensemble's life; a holder whose node
// someone deletes is told within a round trip; a semaphore's limit set by
// locker.Client.Resize is a persistent node beside its queue, kept until
// Resize 0. A lock lasts as long as the driver's session, so every lock of
// a driver has one TTL, the negotiated session timeout; a holder cut off
// from the ensemble is told at its last answered request plus the session
// timeout, less a clock margin, and a longer process pause can overrun
// that: use the fence. locker.LockDelay (locks only) leaves a marker node
// beside the lock that a release deletes with it and that keeps the name
// for the delay after a lost session's end.
//
// Nodes the driver makes get "all permissions for this credential, read
// for everyone" ([DigestACL]; another with [WithACL]); clients sharing a
// lock name must share the credential. Open proves that the credential
// may lock under the root, or fails with an error wrapping
// backend.ErrPermission that names what is missing and the fix.
//
// How it works, in full (the recipe, fencing, retention, sessions and
// TTLs, TLS errors, ACLs, what it cannot promise), is in the repository's
// docs/backends/zklock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/zklock.md
package zklock
