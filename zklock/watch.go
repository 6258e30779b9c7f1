package zklock

import (
	"context"
	"errors"

	"github.com/go-zookeeper/zk"
)

// watch sets a watch on node name of e's queue; a nil channel means the
// node is gone. errGone means e's session ended before the watch was set.
//
// A request that the zk client holds while it reconnects is sent on
// whatever session it then has. Set on a new session, the watch outlives
// e's node, and the zk client never reports the old session's expiry to
// it: the waiter would wait for a predecessor that may never go. So the
// session must be e's after the answer (ids only move forward: it was e's
// all along).
func (d *Driver) watch(ctx context.Context, e *entry, name string) (<-chan zk.Event, error) {
	return callInline(ctx, d, func() (<-chan zk.Event, error) {
		// GetW, not ExistsW: it sets no watch on a missing node, which
		// would never fire (sequence numbers are not reused) and pile up.
		_, _, ch, err := d.conn.GetW(e.parent + "/" + name)
		if d.conn.SessionID() != e.session {
			return nil, errGone
		}
		if errors.Is(err, zk.ErrNoNode) {
			return nil, nil
		}
		return ch, err
	})
}
