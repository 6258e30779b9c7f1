// Package election elects one leader among the replicas of a service, on
// any locker backend, through the portable [locker.Client].
//
// Every candidate calls [Election.Campaign], which waits until it holds
// the election's lock and returns a [Term]. The term's number is the lock's
// fencing token: strictly greater than every earlier term's, on any
// client, so followers and storage can reject a stale leader's writes. The
// term's Context is cancelled the moment leadership is known lost: a
// refresh rejected, the TTL running out without a confirmed refresh (a
// clock margin before the store may free the lock), the backend's session
// ending, or the Client's Close. A new leader can only be granted once the
// store has freed the lock, so two candidates never both believe they lead,
// beyond the delay of waking the goroutine that cancels the Context.
//
// [Election.Leader] and [Election.Observe] serve every replica, leader or
// not. They read the lock with [locker.Client.Inspect]: the leader's value
// is the lock's owner, its term the lock's fence. Observe reads again at
// each notification of [locker.Client.Watch] where the backend has them
// (every backend but file; memcached's come from each driver's poller, every
// 4–16 ms), so a resignation or a handover shows within a few round trips,
// and every PollEvery in any case: a change no store reports (file, a lock
// expiring) is seen within that bound plus one Inspect round trip, and a
// term shorter than it may be missed.
//
// Failover: a leader that resigns or closes its Client frees the lock at
// once, and a waiting candidate takes it as soon as the backend wakes it
// (a release notification or a queue; file off Linux polls with backoff,
// at most 250 ms by default). A leader that dies or is cut off is replaced
// once the store frees its lock: within the TTL after its last confirmed
// refresh (on etcd and ZooKeeper the lease or session timeout), plus the
// store's lateness (up to 1 s on etcd and ZooKeeper; 1 to 2 s on
// memcached, whose clock counts whole seconds) and the wait.
//
// The value a candidate advertises is stored as the lock's owner, and the
// smallest store keeps 64 bytes of it (filelock; memcachelock keeps 200):
// [New] rejects a longer [Value] with [ErrInvalidValue], before any call.
package election
