package zklock

import "github.com/lockerhq/locker/backend"

// rwStanding says whether a reader's or writer's node, with the nodes
// ahead of it, holds: a reader when no writer is ahead of it, a writer
// when it is first (arrival order: readers cannot starve writers). One
// that does not hold watches block: the nearest writer ahead of a reader,
// the node just ahead of a writer.
func rwStanding(ahead []snode, mode backend.Mode) standing {
	var block snode
	block.seq = -1
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
