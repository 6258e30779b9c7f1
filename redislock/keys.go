package redislock

import "github.com/lockerhq/locker/backend"

// keys are the Redis names of one lock key's state. All share the hash tag
// {E}, E being backend.EscapeKey(key) (which has no braces), so they live
// in one Redis Cluster slot and one script can touch them all. ACL's
// patterns follow this layout.
type keys struct {
	// lock holds the holder's token and attempt, with the lock's TTL.
	lock string
	// fence is the name's fencing counter, advanced by the acquire script.
	fence string
	// channel is where a release is published (on the whole server).
	channel string
	// queue and live are the waiters' queue, in order of arrival, and until
	// when each is alive (scripts/queue.lua); hand, what each is handed
	// (scripts/handoff.lua).
	queue, live, hand string
}

// keysFor returns the names of key's state, in one allocation.
func keysFor(key string) keys {
	e := backend.EscapeKey(key)
	all := "{" + e + "}:lock{" + e + "}:fence{" + e + "}:released{" + e + "}:queue{" + e + "}:live{" + e + "}:hand"
	next := func(suffix string) string {
		name := all[:len(e)+2+len(suffix)]
		all = all[len(name):]
		return name
	}
	return keys{lock: next(":lock"), fence: next(":fence"), channel: next(":released"), queue: next(":queue"), live: next(":live"), hand: next(":hand")}
}
