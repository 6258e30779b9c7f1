package redislock

import (
	"strings"

	"github.com/lockerhq/locker/backend"
)

// ACL returns the least Redis 7 ACL (rules for ACL SETUSER, after "on
// >password") under which a Client with this namespace can lock, waiting
// included; the default mode adds the hand-off's key, fair mode PTTL. The
// rules start with resetkeys, resetchannels and -@all, so applied to an
// existing user they leave exactly these.
func ACL(namespace string, fair bool) string {
	// Keys are "{" + EscapeKey(namespace + "/" + name) + "}:<kind>", and
	// EscapeKey escapes byte by byte, so the escaped namespace and '/'
	// prefix every such tag; it has none of the glob's characters.
	p := "{" + backend.EscapeKey(namespace+"/")
	rules := []string{"resetkeys", "resetchannels", "-@all",
		"~" + p + "*}:lock", "~" + p + "*}:fence", "&" + p + "*}:released",
		"+evalsha", "+eval", "+ping", "+subscribe", "+unsubscribe",
		// Called by the scripts (MGET by a set's).
		"+get", "+mget", "+set", "+pexpire", "+time", "+del", "+info", "+publish",
		// The semaphores' and read-write locks' acquire script.
		"+incr", "+exists",
		// The waiters' queue, in both modes.
		"~" + p + "*}:queue", "~" + p + "*}:live",
		"+zrange", "+zscore", "+zadd", "+zrem", "+hget", "+hset", "+hdel"}
	if fair {
		rules = append(rules, "+pttl")
	} else {
		rules = append(rules, "~"+p+"*}:hand")
	}
	return strings.Join(rules, " ")
}

// SharedACL returns the rules to add to ACL's for semaphores and
// read-write locks in namespace (in both modes), apart so that a user who
// only locks keeps the least ACL.
func SharedACL(namespace string) string {
	p := "{" + backend.EscapeKey(namespace+"/")
	sufs := []string{"", ".h", ".fence", ".q", ".live"}
	var rules []string
	for _, kind := range []string{"}:sem", "}:rw"} {
		for _, suf := range sufs {
			rules = append(rules, "~"+p+"*"+kind+suf)
		}
	}
	// A semaphore's resize record, which its acquire script reads.
	rules = append(rules, "~"+p+"*}:sem.limit", "+zadd", "+zrem", "+zcard", "+zscore", "+zrange", "+zrangebyscore", "+zremrangebyscore",
		"+hget", "+hset", "+hdel", "+hexists", "+hmget", "+hincrby")
	return strings.Join(rules, " ")
}
