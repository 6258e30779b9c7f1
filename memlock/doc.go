// Package memlock is an in-process lock store: scheme mem://, for unit tests
// and single-process programs. Every driver opened on the same Store (or
// the same mem://NAME) sees the same locks, as clients of one server would.
//
// It passes the whole conformance suite: exact expiry, fencing tokens
// (a per-key counter kept for the Store's life) and release notifications.
// It does not reach across processes; use file:// or a server for that.
//
// # URLs
//
//	mem://[NAME]
//
// Drivers opened with the same NAME share one process-wide Store ([Named]);
// mem:// is the Store named "". namespace= and ttl= belong to the locker
// package; no other part or parameter is accepted.
package memlock
