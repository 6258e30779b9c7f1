package zklock

import (
	"fmt"
	"strings"

	"github.com/lockerhq/locker/backend"
)

// permitStanding says whether a permit's node of weight permits, with the
// nodes ahead of it in its semaphore's queue, holds: while the permits of
// the nodes ahead and its own are at most limit, so that at most limit
// are held, and waiters are served in arrival order (a claim of several
// is not overtaken by lighter ones behind it). The first node of the
// queue holds under its own limit: a node asking with another one fails
// (it would count the permits otherwise). Once the first node goes, the
// next one's limit holds.
func permitStanding(ahead []snode, limit, weight int) standing {
	if len(ahead) == 0 {
		return standing{held: true}
	}
	first, permits := ahead[0], 0
	for _, n := range ahead {
		if n.seq < first.seq {
			first = n
		}
		_, w := permitOf(n.tag)
		permits += w
	}
	if held, _ := permitOf(first.tag); held != limit {
		return standing{mismatch: fmt.Errorf("%w: held under %d, asked with %d", backend.ErrLimitMismatch, held, limit)}
	}
	return standing{held: permits+weight <= limit}
}

// permitTag is the tag of a permit's node: "p" and its backend.PermitTag.
func permitTag(limit, weight int) string { return "p" + backend.PermitTag(limit, weight) }

// permitOf is the limit and the permits of a permit's tag; a limit of 0
// if it has none.
func permitOf(tag string) (limit, weight int) {
	if limit, weight, ok := backend.ParsePermitTag(strings.TrimPrefix(tag, "p")); ok {
		return limit, weight
	}
	return 0, 1
}
