package zklock

import (
	"github.com/go-zookeeper/zk"
)

// Calls on the caller's goroutine, cut when their context ends
// (conntrack.CutOnEnd): see docs/backends/zklock.md (Calls and
// cancellation) for how and why.

// inline reports whether a call may run on the caller's goroutine: the
// driver dialed the connection (it can cut its reads) and has a session (a
// request is sent at once, not queued for the next connection).
func (d *Driver) inline() bool {
	return d.dialed != nil && !d.testNoInline && d.conn.State() == zk.StateHasSession
}
