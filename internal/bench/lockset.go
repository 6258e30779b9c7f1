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
// time per cycle over the one name's, per round. Every backend takes a
// set name by name today, so about setNames is the expected ratio.
type LockSet struct {
	Names int    `json:"names"`
	One   Rate   `json:"one"`
	Set   Rate   `json:"set"`
	Ratio Spread `json:"ratio"`
}

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
	return LockSet{Names: setNames, One: RateOf(rs[0]), Set: RateOf(rs[1]), Ratio: Ratio(rs[0], rs[1], PerSec)}, nil
}
