package zklock

import (
	"fmt"
	"strconv"

	"github.com/lockerhq/locker/backend"
)

// permitStanding says whether a permit's node, with the nodes ahead of it
// in its semaphore's queue, holds: one of the first limit nodes holds a
// permit, so that at most limit do, and waiters are served in arrival
// order. The first node of the queue holds under its own limit: a node
// asking with another one fails (it would count the permits otherwise).
// Once the first node goes, the next one's limit holds.
func permitStanding(ahead []snode, limit int) standing {
	if len(ahead) == 0 {
		return standing{held: true}
	}
	first := ahead[0]
	for _, n := range ahead[1:] {
		if n.seq < first.seq {
			first = n
		}
	}
	if tag := permitTag(limit); first.tag != tag {
		return standing{mismatch: fmt.Errorf("%w: held under %s, asked with %d", backend.ErrLimitMismatch, first.tag[1:], limit)}
	}
	return standing{held: len(ahead) < limit}
}

// permitTag is the tag of a permit's node: its semaphore's limit.
func permitTag(limit int) string { return "p" + strconv.Itoa(limit) }
