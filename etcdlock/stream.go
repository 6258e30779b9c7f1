package etcdlock

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/internal/retry"
)

// keepStream holds one watch, of a key no lock uses, for as long as the
// driver is open, so that the etcd client's watch stream (one per client,
// shared by every watch of a wait or a subscription) is opened once rather
// than for each wait. Without it, a wait cancelled before etcd confirmed
// its watch left the stream and its four goroutines running until the
// client's next watch ended: the etcd client tears a stream down only
// when its last confirmed watch closes. It also spares each contended
// wait the stream's set-up. The watch goes when the stream breaks (no
// leader): it is made again after a pause.
func (d *Driver) keepStream() {
	defer d.bg.Done()
	ctx := d.gate.Context()
	bo := retry.Backoff{Min: rewatchAfter, Max: 5 * rewatchAfter}
	for {
		for range d.cli.Watch(clientv3.WithRequireLeader(ctx), d.prefix+"/") {
			bo.Reset()
		}
		if retry.Sleep(ctx, bo.Next()) != nil {
			return
		}
	}
}
