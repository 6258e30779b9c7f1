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
// change of it (who holds it, under which term) after. It reads every
// PollEvery (DefaultPoll, or TTL/4 if smaller), so a change arrives within
// that bound plus one read, provided the receiver keeps up (the channel is
// unbuffered: reads wait for it). A term shorter than the bound may be
// missed; terms seen arrive in increasing order. A failed read later is
// skipped: the next one tries again. The channel is closed, and its
// goroutine ends, when ctx ends.
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	first, err := e.Leader(ctx)
	if err != nil {
		return nil, err
	}
	ch := make(chan Leader)
	go e.observe(ctx, first, ch)
	return ch, nil
}

func (e *Election) observe(ctx context.Context, cur Leader, ch chan<- Leader) {
	defer close(ch)
	tick := time.NewTicker(e.cfg.poll)
	defer tick.Stop()
	send, seen := true, cur.Term
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
	}
}
