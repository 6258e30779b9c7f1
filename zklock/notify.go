package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// rewatchAfter spaces the attempts to set a watch again after a failure.
const rewatchAfter = 100 * time.Millisecond

// Subscribe implements backend.Notifier with a watch on key's queue (its
// node's children, or its creation while missing), set again after each
// event: a value at every grant and release. The first watch is set
// before Subscribe returns, and each value is sent once the next is set,
// so no change is missed.
func (d *Driver) Subscribe(ctx context.Context, key string) (_ <-chan struct{}, _ func(), err error) {
	defer func() { err = permitted(err) }()
	ctx, done, err := d.enter(ctx, "subscribe")
	if err != nil {
		return nil, nil, err
	}
	defer done()
	parent := d.parentPath(key)
	ev, err := call(ctx, d, func() (<-chan zk.Event, error) { return d.watchQueue(parent) })
	if err != nil {
		return nil, nil, fmt.Errorf("zklock: subscribe: %w", d.gate.Failed(ctx, err))
	}
	ch := make(chan struct{}, 1)
	sctx, cancel := context.WithCancel(d.gate.Context())
	ended := make(chan struct{})
	if !d.spawn(func() {
		defer close(ended)
		d.relay(sctx, parent, ev, ch)
	}) {
		cancel()
		return nil, nil, d.closedErr("subscribe")
	}
	return ch, sync.OnceFunc(func() { cancel(); <-ended }), nil
}

// watchQueue sets a children watch on parent, or, parent missing, an
// exists watch that fires when it is created.
func (d *Driver) watchQueue(parent string) (<-chan zk.Event, error) {
	for range 3 {
		_, _, ev, err := d.conn.ChildrenW(parent)
		if !errors.Is(err, zk.ErrNoNode) {
			return ev, err
		}
		ok, _, ev, err := d.conn.ExistsW(parent)
		if err != nil || !ok {
			return ev, err
		}
		// Created between the two requests: watch its children.
	}
	return nil, fmt.Errorf("zklock: %s keeps appearing and vanishing", parent)
}

// relay forwards the events of ev, and of the watches set after it, to ch
// until ctx ends: a change after the read that follows a value fires the
// watch set before it.
func (d *Driver) relay(ctx context.Context, parent string, ev <-chan zk.Event, ch chan<- struct{}) {
	for {
		select {
		case <-ev:
		case <-ctx.Done():
			return
		}
		for {
			var err error
			ev, err = call(ctx, d, func() (<-chan zk.Event, error) { return d.watchQueue(parent) })
			if err == nil {
				break
			}
			if retry.Sleep(ctx, rewatchAfter) != nil {
				return
			}
		}
		backend.Notify(ch)
	}
}
