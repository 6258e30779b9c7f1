package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
)

var _ bench.Floorer = (*Driver)(nil)

// RawFloor creates an ephemeral node for key directly under the root and
// deletes it: the least any lock's acquire+release costs, on the driver's
// session, with the requests sent as they are, not through the driver's
// machinery (ctx ends no wait). It makes the root first if it is missing,
// and leaves nothing else behind.
func (d *Driver) RawFloor(ctx context.Context, key string) error {
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
