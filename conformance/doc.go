// Package conformance is the one test suite every lock backend passes, ours
// or a third party's: a backend's tests call [Run] with a [Harness] for a
// real store, in the manner of nettest.TestConn or testing/slogtest.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, myHarness{addr: "127.0.0.1:6379"})
//	}
//
// The suite drives the backend through locker.Client, so it checks the
// semantics users get: exclusion, blocking and cancellation, expiry,
// token-checked release and refresh, the watchdog, the lost-lock signal,
// reentrancy, fencing tokens, bad input and Close. Where a backend cannot
// give a guarantee, the case is skipped with the reason: no fencing tokens
// (the driver returns Fence 0), no per-waiter entries to inspect (the
// harness has no [WaiterCounter]), no FIFO claim for the mode (Traits.FIFO).
// Locks on a [backend.Session] driver expire with the session, so their
// expiry cases use Harness.Expire instead of waiting for the TTL.
//
// Run uses a fresh namespace each time, so it may share a store with other
// tests. Its leak checks compare goroutines before and after, so do not call
// Run from a test that runs in parallel with others.
//
// example_test.go holds a complete harness, for the in-memory backend.
package conformance
