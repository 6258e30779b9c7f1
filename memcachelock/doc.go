// Package memcachelock stores locks in memcached, through
// github.com/bradfitz/gomemcache.
//
//	import _ "github.com/lockerhq/locker/memcachelock"
//
//	c, err := locker.Open(ctx, "memcache://10.0.0.1:11211,10.0.0.2:11211?timeout=500ms")
//
//	memcache://host1:11211[,host2:11211...][?timeout=500ms&max_idle=16&restart_delay=&retention=24h]
//	memcache:///path/to/memcached.sock
//
// With a client of your own, pass [New]'s driver to locker.New. Only
// [Open]'s driver (see it for the parameters) has the restart check and the
// pipelined requests: two round trips per acquire+release, as a bare add
// and delete (New's takes six). A user in the URL is refused: there is no
// authentication.
//
// Guarantees: a lock is one item, taken with add, refreshed and released
// with a token-checked cas, never a blind delete; fences from a per-name
// counter with a clock floor, increasing from holder to holder; a
// restarted server grants no name whose counter it lost until it has run
// for the lock's TTL; waiters queue per Client in arrival order, and
// drivers take turns; semaphores and read-write locks. Limits: memcached
// is a cache, so an eviction, a restart or a flush_all drops held locks
// before their TTL (run it with -M, or on an instance of its own); TTLs are
// whole seconds, and an abandoned lock frees 1-2 s after its TTL; no
// authentication and no TLS: a trusted network only; no list of locks.
//
// Several servers: locks are spread by gomemcache's key hashing, each on
// one unreplicated server, so every process that locks the same names must
// list the same servers in the same order (or two can hold one name).
//
// Holders learn of a theft, an eviction or a restart at their next refresh
// (Lost fires within TTL/3 and a round trip). The holder's token is in the
// item, readable by anyone who can reach the server. gomemcache takes no
// context: each network call is bounded by the client's timeout (the URL's
// timeout, 500ms by default), and the driver checks the context between
// calls.
//
// How it works, in full: docs/backends/memcachelock.md
// (https://github.com/lockerhq/locker/blob/main/docs/backends/memcachelock.md).
package memcachelock
