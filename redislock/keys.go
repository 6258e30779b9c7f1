package redislock

import (
	"strings"

	"github.com/lockerhq/locker/backend"
)

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
	var buf [128]byte // on the stack, for the keys of most names
	e := backend.AppendEscapedKey(buf[:0], key)
	var b strings.Builder
	b.Grow(len(keySuffixes)*(len(e)+2) + len(":lock:fence:released:queue:live:hand"))
	for _, suffix := range keySuffixes {
		b.WriteByte('{')
		b.Write(e)
		b.WriteByte('}')
		b.WriteString(suffix)
	}
	all := b.String()
	next := func(suffix string) string {
		name := all[:len(e)+2+len(suffix)]
		all = all[len(name):]
		return name
	}
	return keys{lock: next(":lock"), fence: next(":fence"), channel: next(":released"), queue: next(":queue"), live: next(":live"), hand: next(":hand")}
}

// keySuffixes are keys' names after the hash tag, in keysFor's order.
var keySuffixes = [...]string{":lock", ":fence", ":released", ":queue", ":live", ":hand"}
