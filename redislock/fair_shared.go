package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/lockerhq/locker/backend"
)

// acquireShared is Acquire for a permit, a read or a write, in both
// modes: it joins the object's queue (see scripts/shared_queue.lua) and waits, woken by
// releases and by grants to those ahead, until it is granted in arrival
// order, ctx ends, or every try has failed for retry.Budget. When it
// returns an error it leaves the queue.
func (d *Driver) acquireShared(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if err := checkShared(l); err != nil {
		return backend.Grant{}, fmt.Errorf("redislock: %w", err)
	}
	// A writer's name starts with 'w', so that readers behind it wait.
	w := sharedMode(l) + strconv.FormatUint(rand.Uint64(), 36) + ":" + l.Owner
	px := ttlMillis(l.TTL)
	n := attempts.Add(1) // one attempt for the whole wait: a retried try is recognized
	return d.waitInQueue(ctx, queuedWaiter{
		px: px,
		try: func() (int64, error, error) {
			r, err := d.dep.acquireShared(ctx, l, n, px, w, true, true)
			if err == nil && r.limit != "" {
				return 0, limitMismatch("acquire", r.limit, l.Limit), nil
			}
			return r.v, nil, err
		},
		subscribe: func(ch chan struct{}) (func(), error) { return d.dep.subscribe(ctx, l.Key, ch) },
		leave:     func(ctx context.Context) { d.dep.leaveShared(ctx, l, n, w) },
	})
}
