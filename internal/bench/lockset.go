package bench

import (
	"context"
	"fmt"
	"time"
)

// setNames is how many names the lock-set workload takes at once.
const setNames = 4

// LockSet compares, on one Client, a set of setNames names taken and
// released together (TryAcquireAll) with one name's TryAcquire+Release,
// by one goroutine, in alternating blocks over rounds: Ratio is the set's
// time per cycle over the one name's, per round: about setNames where a
// backend takes a set name by name, nearer 1 where it takes it in one
// request (backend.SetAcquirer).
type LockSet struct {
	Names int    `json:"names"`
	One   Rate   `json:"one"`
	Set   Rate   `json:"set"`
	Ratio Spread `json:"ratio"`
	// Crossed is crossedWorkers goroutines on two Clients, each taking
	// two names of a ring of three with AcquireAll, in crossed orders
	// ({a, b} against {b, a}, and {c, a} closing the ring): the order in
	// which hand-written multi-locks deadlock. Its Errors count the sets
	// not taken within crossedWait: zero without a deadlock.
	Crossed Rate `json:"crossed"`
}

// crossedWorkers and crossedWait bound the crossed-order run.
const (
	crossedWorkers = 6
	crossedWait    = 10 * time.Second
)

func RunLockSet(ctx context.Context, cs clients, cfg Config) (LockSet, error) {
	cfg = cfg.withDefaults()
	c, err := cs.client(ctx)
	if err != nil {
		return LockSet{}, err
	}
	defer c.Close()
	set := make([]string, setNames)
	for i := range set {
		set[i] = fmt.Sprintf("set-%d", i)
	}
	one := func(ctx context.Context, _ int) error {
		l, err := c.TryAcquire(ctx, "set-one")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	all := func(ctx context.Context, _ int) error {
		s, err := c.TryAcquireAll(ctx, set)
		if err != nil {
			return err
		}
		return s.Release(ctx)
	}
	const rounds = 6
	per := max(cfg.Duration/(2*rounds), 10*time.Millisecond)
	rs, err := Interleave(ctx, 1, rounds, per, one, all)
	if err != nil {
		return LockSet{}, err
	}
	c2, err := cs.client(ctx)
	if err != nil {
		return LockSet{}, err
	}
	defer c2.Close()
	ring := []string{"crossed-a", "crossed-b", "crossed-c"}
	crossed := func(ctx context.Context, g int) error {
		cl, pair := c, []string{ring[g%3], ring[(g+1)%3]}
		if g%2 == 1 {
			cl, pair[0], pair[1] = c2, pair[1], pair[0]
		}
		ctx, cancel := context.WithTimeout(ctx, crossedWait)
		defer cancel()
		s, err := cl.AcquireAll(ctx, pair)
		if err != nil {
			return err
		}
		return s.Release(ctx)
	}
	xs, err := Interleave(ctx, crossedWorkers, 2, cfg.Duration/2, crossed)
	if err != nil {
		return LockSet{}, fmt.Errorf("crossed orders: %w", err)
	}
	return LockSet{Names: setNames, One: RateOf(rs[0]), Set: RateOf(rs[1]), Ratio: Ratio(rs[0], rs[1], PerSec), Crossed: RateOf(xs[0])}, nil
}
