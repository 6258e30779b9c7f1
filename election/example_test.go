package election_test

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/election"
)

func Example() {
	ctx := context.Background()
	// Any backend URL works; mem:// keeps the example self-contained.
	c, err := locker.Open(ctx, "mem://example")
	if err != nil {
		panic(err)
	}
	defer c.Close()

	e, err := election.New(c, "scheduler", election.Value("10.0.0.7:8080"))
	if err != nil {
		panic(err)
	}
	term, err := e.Campaign(ctx) // waits until this replica leads
	if err != nil {
		panic(err)
	}
	// Do the leader's work under term.Context(), which is cancelled the
	// moment leadership is lost, and stamp writes with term.Number().
	l, err := e.Leader(ctx) // what every replica sees
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Held, l.Value, l.Term == term.Number())
	if err := term.Resign(ctx); err != nil {
		panic(err)
	}
	fmt.Println(term.Context().Err())
	// Output:
	// true 10.0.0.7:8080 true
	// context canceled
}
