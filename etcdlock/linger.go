package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

var _ backend.Lingerer = (*Driver)(nil)

// Linger implements backend.Lingerer (MinHold): it moves the held entry
// to a lease of its own, for l.TTL and never renewed, so etcd deletes it
// then, whatever becomes of this driver, and the next waiter takes the
// lock. It keeps its key, value and creation revision: first in the queue,
// with its owner and fence.
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
		return fmt.Errorf("etcdlock: grant: %w", d.gate.Failed(ctx, permission(err)))
	}
	// No loss is reported for the entry from here on: its holder is done.
	if !d.forget(e) {
		d.revokeLater(g.ID)
		return fmt.Errorf("etcdlock: %w", backend.ErrNotHeld)
	}
	resp, _, err := d.txn(ctx, new(retry.Failing), func(ctx context.Context) clientv3.Txn {
		return d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(e.s.key), "=", e.rev)).
			Then(clientv3.OpPut(e.s.key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(g.ID)))
	})
	if err != nil || !resp.Succeeded {
		d.revokeLater(g.ID)
		// Under the session's lease, or gone: released either way.
		d.orphan(e.s, e.rev)
		return fmt.Errorf("etcdlock: %w", cmp.Or(err, backend.ErrNotHeld))
	}
	// The slot's name stays taken until etcd has deleted the entry, so that
	// no later acquisition of this driver reuses it meanwhile.
	time.AfterFunc(time.Duration(g.TTL)*time.Second+opTimeout, func() { d.free(e.s) })
	return nil
}
