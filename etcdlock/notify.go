package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

var _ backend.Notifier = (*Driver)(nil)

// rewatchAfter spaces the restarts of a broken watch.
const rewatchAfter = 100 * time.Millisecond

// Subscribe implements backend.Notifier with a watch on key's queue: a
// value arrives at every put or delete of an entry. The watch starts just
// after the revision read before Subscribe returns, so no later change is
// missed; a watch that breaks starts again where it stopped, or, after a
// compaction, from now with a value sent for the gap.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("etcdlock: subscribe: %w", err)
	}
	defer done()
	dir := d.Dir(key)
	resp, err := d.cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, nil, fmt.Errorf("etcdlock: subscribe: %w", permission(d.gate.Failed(ctx, err)))
	}
	// Running when Subscribe returns: a refusal shows here, and a stop
	// right away closes it cleanly.
	rev := resp.Header.Revision + 1
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(d.gate.Context()))
	wch := d.cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil || !wr.Created {
			cancel()
			err := cmp.Or(wr.Err(), errors.New("the watch ended before it started"))
			return nil, nil, fmt.Errorf("etcdlock: subscribe: %w", permission(err))
		}
	case <-ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("etcdlock: subscribe: %w", d.gate.Failed(ctx, nil))
	}
	ch := make(chan struct{}, 1)
	ended := make(chan struct{})
	d.bg.Go(func() { // inside the gate: Close waits for the calls before bg
		defer close(ended)
		d.relay(wctx, dir, wch, rev, ch)
	})
	return ch, sync.OnceFunc(func() { cancel(); <-ended }), nil
}

// A watch silent for progressEvery is asked for progress; none within
// progressWait means the stream went silent without breaking, and a value
// is sent once it answers again (see "Subscriptions" in the docs).
const (
	progressEvery = time.Second
	progressWait  = 2 * time.Second
)

// relay forwards the changes of dir on wch, and on the watches that
// replace it from revision rev, to ch until ctx ends.
func (d *Driver) relay(ctx context.Context, dir string, wch clientv3.WatchChan, rev int64, ch chan<- struct{}) {
	// heard: the last answer; asked: the first progress request since,
	// lastAsk the latest.
	heard, asked, lastAsk := time.Now(), time.Time{}, time.Time{}
	silent := false // no answer to a progress request within progressWait
	tick := time.NewTicker(progressEvery / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case wr, ok := <-wch:
			if !ok {
				if retry.Sleep(ctx, rewatchAfter) != nil {
					return
				}
				wch = d.cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(rev))
				heard, asked = time.Now(), time.Time{}
				continue
			}
			heard, asked = time.Now(), time.Time{}
			if silent {
				silent = false
				backend.Notify(ch)
			}
			switch {
			case wr.CompactRevision != 0:
				rev = 0 // what it missed is gone: from now on
				backend.Notify(ch)
			case wr.Err() != nil:
			case len(wr.Events) > 0:
				rev = wr.Events[len(wr.Events)-1].Kv.ModRevision + 1
				backend.Notify(ch)
			}
		case <-tick.C:
			now := time.Now()
			if !asked.IsZero() && now.Sub(asked) >= progressWait {
				silent = true
			}
			if now.Sub(heard) >= progressEvery && now.Sub(lastAsk) >= progressEvery {
				if asked.IsZero() {
					asked = now
				}
				lastAsk = now
				rctx, cancel := context.WithTimeout(ctx, progressWait)
				_ = d.cli.RequestProgress(rctx)
				cancel()
			}
		}
	}
}
