package etcdlock

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/internal/retry"
)

// keepStream holds one watch, of a key no lock uses, while the driver is
// open, so that the client's shared watch stream opens once: the client
// tears a stream down only when its last confirmed watch closes, so a wait
// cancelled before its watch was confirmed would leave it running (see
// "Waiting" in the docs). A broken stream's watch is made again.
func (d *Driver) keepStream() {
	ctx := d.gate.Context()
	bo := retry.Backoff{Min: rewatchAfter, Max: 5 * rewatchAfter}
	for {
		for range d.cli.Watch(clientv3.WithRequireLeader(ctx), d.prefix+"/") {
			bo.Reset()
		}
		if !bo.Pause(ctx) {
			return
		}
	}
}
