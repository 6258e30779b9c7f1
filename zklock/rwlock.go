package zklock

import "github.com/lockerhq/locker/backend"

// rwStanding says whether a reader's or writer's node, with the nodes
// ahead of it in its read-write lock's queue, holds. Readers and writers
// queue in arrival order: a reader holds when no writer is ahead of it, a
// writer when it is first. A reader arriving after a waiting writer waits
// behind it, so a stream of readers cannot starve writers. A waiter that
// does not hold watches block: for a reader the nearest writer ahead of
// it (readers ahead of it hold or wait for a writer too), for a writer
// the node just ahead of it.
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
