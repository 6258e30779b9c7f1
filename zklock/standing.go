package zklock

import (
	"cmp"
	"slices"
	"strings"

	"github.com/lockerhq/locker/backend"
)

// permitStanding says whether a permit's node (weight, seq), with the
// nodes ahead of it, holds: while their permits and its own are at most
// limit, in arrival order (no lighter claim overtakes a heavier one). The
// first node's limit rules: a node asking with another fails. A resize
// record r rules instead: the nodes that held when it was written hold,
// the others are judged under its limit (a removed limit: none more).
func permitStanding(ahead []snode, seq int64, r *resized, limit, weight int) standing {
	switch {
	case r == nil:
	case seq <= r.upto:
		return standing{held: true}
	case r.limit == 0:
		// Removed: the claims' limits rule.
	case weight > r.limit:
		return standing{mismatch: backend.ResizedTo(weight, r.limit)}
	default:
		return standing{held: permits(ahead)+weight <= r.limit}
	}
	if len(ahead) == 0 {
		return standing{held: true}
	}
	first := slices.MinFunc(ahead, func(a, b snode) int { return cmp.Compare(a.seq, b.seq) })
	if held, _ := permitOf(first.tag); held != limit {
		return standing{mismatch: backend.HeldUnder(held, limit)}
	}
	return standing{held: permits(ahead)+weight <= limit}
}

// permits is the permits of nodes together.
func permits(nodes []snode) int {
	n := 0
	for _, s := range nodes {
		_, w := permitOf(s.tag)
		n += w
	}
	return n
}

// permitTag is the tag of a permit's node: "p" and its backend.PermitTag.
func permitTag(limit, weight int) string { return "p" + backend.PermitTag(limit, weight) }

// permitOf is the limit (0 if none) and the permits of a permit's tag.
func permitOf(tag string) (limit, weight int) {
	if limit, weight, ok := backend.ParsePermitTag(strings.TrimPrefix(tag, "p")); ok {
		return limit, weight
	}
	return 0, 1
}

// rwStanding says whether a reader's or writer's node, with the nodes
// ahead of it, holds: a reader when no writer is ahead, a writer when
// first (readers cannot starve writers). Else it watches block: the
// nearest writer ahead of a reader, the node just ahead of a writer.
func rwStanding(ahead []snode, mode backend.Mode) standing {
	block := snode{seq: -1}
	for _, n := range ahead {
		if (mode == backend.Write || n.tag == "w") && n.seq > block.seq {
			block = n
		}
	}
	if block.seq < 0 {
		return standing{held: true}
	}
	return standing{block: block.name}
}

// rwMode is the side of a read-write lock's node with tag.
func rwMode(tag string) backend.Mode {
	if tag == "w" {
		return backend.Write
	}
	return backend.Read
}
