// Package memcachelock stores locks in memcached, through
// github.com/bradfitz/gomemcache.
//
//	import _ "github.com/lockerhq/locker/memcachelock"
//
//	c, err := locker.Open(ctx, "memcache://10.0.0.1:11211,10.0.0.2:11211?timeout=500ms")
//
// or, with a client you built yourself, memcachelock.New(mc) passed to
// locker.New.
//
// # How it works
//
// A lock is one item. Acquiring is add (atomic create-if-absent) with the
// TTL as the item's expiration and the holder's token as its value.
// Refreshing and releasing are gets, a check of the token, then cas, which
// succeeds only if nobody changed the item since the gets: so this backend
// never extends or removes another holder's lock. memcached has no
// compare-and-delete; a release is a cas to a tombstone with a negative
// expiration, which memcached treats as already expired, so the item is gone
// at once. (A blind delete, or a get followed by a delete, as many memcached
// lock libraries do, can remove the next holder's lock.)
//
// Fencing tokens come from a per-name counter advanced with incr, drawn
// while the new holder's item exists and confirmed, before the lock is
// granted, by a gets and a cas that records the fence in the item (for
// Inspect and Break), so they increase strictly from holder to holder.
//
// Fences and retention: memcached has no counter shared by every name, so
// the fence uses a clock floor. A missing counter is added with the
// client's clock in microseconds and an expiry of the retention
// ([WithRetention], URL retention=, default 24h, in whole seconds), the
// seed being the fence of the acquisition whose add created it; incr does
// not move the expiry, so the counter vanishes the
// retention after its seed (or sooner: a restart, an eviction) and is
// seeded again from the clock. A release turns the lock's item into one
// that memcached treats as expired at once, so the retention after a
// name's last release, nothing of it is left: per-entity names do not pile
// up. The fence stays larger than every earlier one provided that the
// counter was advanced fewer times than microseconds passed between its
// seed and the reseed (every acquisition takes three round trips or more,
// so it runs far behind the clock), and that the reseeding client's clock is not
// behind the previous seeder's by more than the difference (about the
// retention, less the fences handed out): keep client clocks synchronised
// (NTP), within far less than the retention, and never step them back.
// The details are in the source (nextFence). The counter costs no round
// trip on the hot path: incr first, and add only when incr finds none.
//
// An uncontended acquisition costs four requests (add, incr, gets, cas)
// and a release two (gets, cas), against two for a bare add and delete. A
// driver made by [Open] (which knows the server list) sends the incr and
// the gets in one write, and the cas with a gets whose cas id lets the
// release be a single cas: three round trips to acquire and one to
// release, on a name used before; a name without a counter adds one (the
// seed's add, with its gets). The driver keeps a few connections of its
// own per server for these, beside gomemcache's. On gomemcache's, it has
// at most 16 requests in flight per server, and others wait for one (up
// to the client's timeout, then go anyway): a dial costs more than the
// wait, and a thousand waiters would otherwise pass memcached's connection
// limit. Open keeps as many idle (max_idle).
//
// # Semaphores and read-write locks
//
// The driver is a backend.Modal: a key's semaphore and read-write lock are
// items of their own beside its lock (shared.go), with memcached's expiry
// as their TTL and a fence counter each, drawn as the lock's is. A
// semaphore of limit L is L slot items taken with add; a limit record,
// written with cas after the add, makes a claim under another limit fail
// with ErrLimitMismatch (semaphore.go). A permit on a semaphore used before
// costs three round trips to acquire and two to release, five against a
// lock's four (TestPermitRoundTrips), and four to refresh. A read-write
// lock is a writer item and MaxReaders (128)
// reader slots, exclusive by "write mine, then check theirs"; writers are
// preferred through a waiting writer's record (rwlock.go). No FIFO: waiters
// back off, woken at once by a release through the same driver.
// Acquisitions cost more with the limit: a claim that finds its
// first slot taken, and a writer, read all the slots in one round trip.
//
// # Operators
//
// The driver implements backend.Inspector and backend.Breaker. Inspect is
// one get: whether the lock is held, the holder's owner (its first 200
// bytes) and fence, which the item records (a holder whose acquisition has
// not yet recorded it, for the moment between its add and its cas, or an
// item of an older version, is reported without a fence). It reports no
// TTL: memcached cannot tell how long an item has left, and the item keeps
// no deadline. No queue in the store (see Waiting). Break is a release under the fence:
// gets, then a cas to the expired tombstone, which fails if the item
// changed since; the fence counter stays, so the next fence is above, and
// the removed holder's next refresh finds no item. There is no
// backend.Lister: memcached cannot enumerate its keys.
//
// RefreshMany (backend.BatchRefresher), which the locker package's
// watchdog uses for locks that fall due together, refreshes a batch in two
// round trips per server: pipelined gets, then pipelined cas.
//
// # TTLs
//
// memcached counts expiry in whole seconds, on a clock that ticks once a
// second and whose ticks drift. TTLs are rounded up to whole seconds
// (Lock.TTL reports the effective TTL, at least one second), and the driver
// asks memcached for two seconds more, so that the lock lives at least its
// effective TTL whatever the phase of memcached's clock. Another client can
// take an abandoned lock between one and two seconds after its effective
// TTL. TTLs up to 30 days work; the last two seconds of that range are sent
// as an absolute Unix time, as memcached requires, and rely on the server's
// clock being right.
//
// # Waiting
//
// memcached cannot notify a waiter when a lock is released; the driver
// does without (backend.Notifier), and all of it is advice, never a
// condition for holding: only add and cas on the lock's item decide who
// holds, so an eviction, a crash or a cut connection costs waiting time or
// fairness, never exclusion. Within one driver, waiters on a lock queue in
// arrival order; only the first goes to the store, the others (and a
// releaser that comes back at once) are refused without a round trip,
// and a release wakes them at once. Between drivers, the first waiter of a
// driver that finds the lock held elsewhere appends a mark with its token
// to the holder's item; the holder's release reads the item anyway, and
// when it finds a mark from another driver, its own driver leaves the lock
// to that waiter (until the lock has been taken, at most 48ms), after at
// most two local handoffs in a row. A wait that ends appends the
// withdrawal of its mark; an evicted item takes its marks with it. Releases
// elsewhere are seen by one poller per driver: a multi-get of the watched
// locks and their fence counters every 500µs while one of its waiters is
// marked as next (for up to 250ms), else every 4ms, backing off to 16ms
// while nothing changes.
// A release through the same driver wakes its next waiter at once, one
// elsewhere within the poll interval and a round trip. Semaphore and
// read-write waiters are woken at once by releases through their driver,
// and back off (the locker package's capped exponential backoff with
// jitter) for releases elsewhere.
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
// seeded again as described above.
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
