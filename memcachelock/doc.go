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
// With a client of your own, make the driver with [New] and pass it to
// locker.New; [Open] makes its own (see it for the parameters), and only
// such a driver has the restart check and the pipelined, fewer round
// trips. There is no authentication: a user in the URL is refused.
//
// Guarantees: a lock is one item, taken with add and refreshed and
// released with a token-checked cas, never a blind delete; fences from a
// per-name counter with a clock floor, increasing from holder to holder; a
// restarted server grants no name whose counter it lost until it has run
// for the lock's TTL; waiters queue per Client in arrival order, and
// drivers take turns; semaphores and read-write locks. Limits: memcached
// is a cache, so an eviction, a restart or a flush_all drops held locks
// before their TTL (run it with -M, or on an instance of its own); TTLs are
// whole seconds, and an abandoned lock frees 1-2 s after its TTL; no
// authentication and no TLS: a trusted network only; no list of locks.
//
// How it works, in full (items, fences and retention, round trips,
// semaphores, operators, TTLs, waiting) is in the repository's
// docs/backends/memcachelock.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends/memcachelock.md
//
// # Several servers
//
// A URL or client with several servers spreads locks over them by
// gomemcache's key hashing; each lock lives on one server, which is not
// replicated. Every process that locks the same names must list the same
// servers in the same order, or two processes can map one name to two
// servers and both hold it. When a lock's server is down, that lock can
// neither be acquired nor refreshed (held locks are reported lost when
// their TTL runs out); locks on other servers are unaffected. A lock's item
// and its fence counter are hashed separately and may live on different
// servers. That does not weaken the fences: their order rests only on the
// order in which each client sends its commands, and a lost counter is
// seeded again from the clock (see "Fences and retention" in
// docs/backends/memcachelock.md).
//
// # What memcached cannot promise
//
// memcached is a cache. It can drop a held lock before its TTL:
//
//   - Eviction: when memory is full, memcached evicts items, held locks
//     included. Run memcached with -M (return errors instead of evicting)
//     and enough memory (-m), or on instances that hold nothing but locks.
//   - Restart: a restarted memcached has forgotten every lock.
//   - flush_all, or anything else that deletes or overwrites the items.
//
// When that happens, another client can acquire the lock while the old
// holder still believes it holds it, until the old holder's next refresh
// (every TTL/3 with automatic refresh), which finds the loss and fires the
// lock's Lost channel. Use the fencing token where exclusion matters.
//
// There is no authentication: gomemcache implements none (memcached's SASL
// needs the binary protocol, which it does not speak), and the URL form
// offers no TLS. Anyone who can reach the server can read, take and delete
// every lock. Use this backend only on a trusted network, with memcached
// bound to private addresses. A holder whose item another client deleted
// or overwrote learns it at its next refresh, which the locker package's
// watchdog sends at most TTL/3 after the one before: Lost fires within
// TTL/3 and a round trip of the theft (TTL is the effective, whole-second
// TTL; measured: 333ms for a 1s TTL, theft right after a refresh). The
// holder's token is in the item, for anyone to read: with it, another
// client can also refresh or release the lock as if it were the holder. (For a memcached built with TLS, a client of
// your own with a TLS DialContext, passed to New, encrypts the traffic; it
// still authenticates nobody.)
//
// gomemcache takes no context: each network call is bounded by the client's
// timeout (the URL's timeout parameter, 500ms by default) instead, and the
// driver checks the context between calls.
package memcachelock
