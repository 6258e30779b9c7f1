package election

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker"
)

// Leader is the state of an election as the store reports it.
type Leader struct {
	// Held: someone leads.
	Held bool
	// Value is what the leader advertises; "" when nobody leads.
	Value string
	// Term is the leader's term number (its lock's fence); 0 when nobody
	// leads.
	Term uint64
}

// Leader reads who leads now. It returns an error wrapping
// locker.ErrUnsupported when the backend cannot read a lock's owner and
// fence (see locker.State.Known).
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	s, err := e.c.Inspect(ctx, e.name)
	if err != nil {
		return Leader{}, fmt.Errorf("election: leader %q: %w", e.name, err)
	}
	if !s.Held {
		return Leader{}, nil
	}
	if !s.Known.Has(locker.KnowsOwner) || !s.Known.Has(locker.KnowsFence) {
		return Leader{}, fmt.Errorf("election: leader %q: %w: the backend does not report the lock's owner and fence", e.name, locker.ErrUnsupported)
	}
	return Leader{Held: true, Value: s.Owner, Term: s.Fence}, nil
}

// Observe reads the election once, returns the error if that fails, and
// otherwise returns a channel that receives the state read then and every
// change of it (who holds it, under which term) after. Where the backend
// reports releases (every backend but file; see locker.Client.Watch), a
// resignation or a Close shows within a round trip or two (memcached: its
// poller's 4–16 ms), and the successor's grant with it; it also reads every
// PollEvery (DefaultPoll, or TTL/4 if smaller), the bound for a change no
// store reports (a lock expiring) and for file, which reports nothing. The receiver must keep up: the channel is unbuffered, reads wait
// for it. A term shorter than the bound may be missed; terms seen arrive in
// increasing order. A failed read later is skipped: the next one tries
// again. The channel is closed, and its goroutine ends, when ctx ends.
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	first, err := e.Leader(ctx)
	if err != nil {
		return nil, err
	}
	// Without notifications (ErrUnsupported, or a store error now),
	// polling alone still observes.
	changes, stop, err := e.c.Watch(ctx, e.name)
	if err != nil {
		changes, stop = nil, func() {}
	}
	ch := make(chan Leader)
	go func() {
		defer stop()
		e.observe(ctx, first, changes, ch)
	}()
	return ch, nil
}

// followUps are the delays of the reads after a notification while nobody
// is seen holding the lock: a release is reported before the successor's
// grant, which follows within a few round trips.
var followUps = [...]time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 80 * time.Millisecond}

func (e *Election) observe(ctx context.Context, cur Leader, changes <-chan struct{}, ch chan<- Leader) {
	defer close(ch)
	tick := time.NewTicker(e.cfg.poll)
	defer tick.Stop()
	soon := time.NewTimer(time.Hour)
	soon.Stop()
	defer soon.Stop()
	send, seen := true, cur.Term
	quick := len(followUps) // follow-up reads left
	for {
		if send {
			select {
			case ch <- cur:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-tick.C:
		case <-changes:
			quick = 0
		case <-soon.C:
		case <-ctx.Done():
			return
		}
		l, err := e.Leader(ctx)
		// A term below the last one seen is a stale read from a replica
		// behind the leader's (etcd's serializable reads, a lagging
		// ZooKeeper server): never report time going backwards.
		send = err == nil && l != cur && (!l.Held || l.Term >= seen)
		if send {
			cur, seen = l, max(seen, l.Term)
		}
		if (err != nil || !l.Held) && quick < len(followUps) {
			soon.Reset(followUps[quick])
			quick++
		}
	}
}
