package etcdlock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/backend"
)

var _ backend.Lingerer = (*Driver)(nil)

// Linger implements backend.Lingerer (the locker package's MinHold): it
// moves the held entry to a lease of its own, granted for l.TTL and never
// kept alive, so the entry outlives this driver's session and etcd deletes
// it when that lease runs out; the next waiter, watching it, takes the lock
// then. The entry keeps its key, value and creation revision, so it stays
// first in the queue and Inspect still reports its owner and fence.
func (d *Driver) Linger(ctx context.Context, l backend.Claim) error {
	ctx, end, e, err := d.heldEntry(ctx, l)
	if err != nil {
		return err
	}
	defer end()
	sec, err := ttlSeconds(l.TTL)
	if err != nil {
		return fmt.Errorf("etcdlock: %w", err)
	}
	g, err := d.cli.Grant(ctx, sec)
	if err != nil {
		return fmt.Errorf("etcdlock: grant: %w", d.failed(ctx, permission(err)))
	}
	// No loss is reported for the entry from here on: its holder is done.
	if !d.forget(e) {
		d.revokeLater(g.ID)
		return fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	resp, err := d.txn(ctx, func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(e.s.key), "=", e.rev)).
			Then(clientv3.OpPut(e.s.key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(g.ID)))
	})
	if err != nil || !resp.Succeeded {
		d.revokeLater(g.ID)
		// The entry is still under the session's lease, or gone: either
		// way it is released as a Release would leave it.
		d.orphan(e.s, e.rev)
		if err != nil {
			return fmt.Errorf("etcdlock: %w", err)
		}
		return fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	// The slot's name stays taken until etcd has deleted the entry, so that
	// no later acquisition of this driver reuses it meanwhile.
	time.AfterFunc(time.Duration(g.TTL)*time.Second+opTimeout, func() { d.free(e.s) })
	return nil
}
