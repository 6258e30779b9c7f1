// Package backend is the contract between the portable locker package and
// the stores that hold locks: Redis, memcached, PostgreSQL, etcd, ZooKeeper,
// or a third party's.
//
// It follows database/sql/driver and gocloud's driver packages: a driver is
// thin and reports facts; every policy (waiting, backoff, reentrancy,
// watchdog refresh, lost-lock signals, input validation) lives once in the
// locker package. A driver implements the small required interface [Driver]
// and, where its store allows, optional interfaces that the locker package
// finds by type assertion: [Queuer] (the store's own queue), [Notifier]
// (release notifications), [Session] (locks kept alive by a server-side
// session) and [BatchRefresher] (many refreshes in one round trip).
//
// Drivers receive only validated input: keys are non-empty valid UTF-8 with
// no NUL byte, at most [MaxKeyLen] bytes, and TTLs are positive. A driver
// encodes keys as its store requires (escaping, hashing) so that every valid
// key works.
//
// A driver registers a URL scheme with [Register] in its package init, so
// that a blank import makes locker.Open("scheme://...") work. locker.Open
// passes the Client's logger ([Logger]) and, when set, its default lock TTL
// ([DefaultTTL]) to the Opener in its context.
package backend
