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

// storeTries is the requests of the driver's waiting acquisitions that
// could grant them: each create of a queue node, and each listing to see
// whether the node holds (when a waiter starts waiting, and when the node
// it watches goes). A waiter whose only predecessor went counts none.
func (d *Driver) storeTries() uint64 { return d.tries.Load() }

// rawFloor creates an ephemeral node for key under the root and deletes
// it: the least an acquire+release costs, bare requests on the driver's
// session (ctx ends no wait). It makes a missing root first.
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
