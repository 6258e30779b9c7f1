// Package memlock is an in-process lock store: scheme mem://, for unit tests
// and single-process programs. Every driver opened on the same Store (or
// the same mem://NAME) sees the same locks, as clients of one server would.
//
//	import _ "github.com/lockerhq/locker/memlock"
//
//	c, err := locker.Open(ctx, "mem://")
//
// Or make a driver on a Store of your own, [New]([NewStore]()), and pass it
// to locker.New.
//
// It passes the whole conformance suite: exact expiry, fencing tokens
// (one counter for the whole Store, across names, kept for its life) and
// release notifications.
// It does not reach across processes; use file:// or a server for that.
// How the backends compare is in the repository's docs/backends.md:
// https://github.com/lockerhq/locker/blob/main/docs/backends.md
//
// # URLs
//
//	mem://[NAME]
//
// Drivers opened with the same NAME share one process-wide Store ([Named]);
// mem:// is the Store named "". namespace= and ttl= belong to the locker
// package; no other part or parameter is accepted.
package memlock
