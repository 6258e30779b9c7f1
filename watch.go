package locker

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
)

// Watch returns a channel that receives a value whenever the lock name may
// have changed hands: at every release, and on stores that report it
// (etcd, ZooKeeper) at every grant too. Values coalesce while the receiver
// is busy (the channel holds one), so read the state with Inspect after
// each. A change after Watch returns is never missed, but an expiry is no
// release: Redis, PostgreSQL and mem say nothing when a lock's TTL runs
// out, so a watcher that must see those reads Inspect on a timer as well.
//
// Values arrive until stop is called, ctx ends, or the Client closes; the
// channel is never closed. On memcached the notifications come from each
// driver's poller (every 4-16 ms). Watch returns an error wrapping
// ErrUnsupported when the backend has no notifications (file; poll Inspect
// there), and ErrInvalidName for a bad name, before any call.
func (c *Client) Watch(ctx context.Context, name string) (_ <-chan struct{}, stop func(), _ error) {
	const op = "watch"
	if err := CheckName(name); err != nil {
		return nil, nil, fmt.Errorf("locker: %s: %w", op, err)
	}
	if c.notifier == nil {
		return nil, nil, fmt.Errorf("locker: %s %q: %w: the backend does not report releases", op, name, ErrUnsupported)
	}
	gctx, end, err := c.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	defer end()
	key := backend.Key(c.cfg.namespace, name)
	sub, err := guard(c, gctx, func(ctx context.Context) (subscription, error) {
		ch, cancel, err := c.notifier.Subscribe(ctx, key)
		return subscription{ch, cancel}, err
	}, func(s subscription) { s.cancel() })
	if err != nil {
		return nil, nil, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	unhook := context.AfterFunc(ctx, sub.cancel)
	return sub.ch, func() { unhook(); sub.cancel() }, nil
}
