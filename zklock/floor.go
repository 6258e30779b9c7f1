package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the driver's API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
	measure.RegisterStoreTries((*Driver).storeTries)
}

// storeTries is the requests that the driver's waiting acquisitions
// (Enqueue, Ticket.Wait) sent that could grant them, since it opened: each
// create of a queue node, and each listing of the queue made to see
// whether the node is first (or, for semaphores and read-write locks,
// holds), which a waiter makes when it starts waiting and when the node it
// watches goes. A waiter told by a watch that its only predecessor is gone
// takes the lock with no request, and counts none.
func (d *Driver) storeTries() uint64 { return d.tries.Load() }

// rawFloor creates an ephemeral node for key directly under the root and
// deletes it: the least any lock's acquire+release costs, on the driver's
// session, with the requests sent as they are, not through the driver's
// machinery (ctx ends no wait). It makes the root first if it is missing,
// and leaves nothing else behind.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	_, done, err := d.enter(ctx, "raw floor")
	if err != nil {
		return err
	}
	defer done()
	p := d.root + "/floor~" + backend.EscapeKey(key) // "~": never a name's node
	for range 2 {
		_, err = d.conn.Create(p, nil, zk.FlagEphemeral, d.acl)
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		if err = d.ensureRoot(); err != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("zklock: raw floor: %w", permitted(err))
	}
	if err := d.conn.Delete(p, -1); err != nil {
		return fmt.Errorf("zklock: raw floor: %w", err)
	}
	return nil
}
