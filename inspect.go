package locker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// State is what the store knows about a lock now: the answer of Inspect,
// List and ForceRelease. Held is always known; each other field means
// something only when Known has its bit (see backend.State for who knows
// what, and the backend table in the repository's docs/backends.md).
type State struct {
	// Name is the lock's name, without the Client's namespace.
	Name string
	// Held: someone holds the lock and, where locks expire, its TTL has
	// not run out.
	Held bool
	// Owner is the holder's label (see WithLabel and Label; "" if it
	// gave none).
	Owner string
	// Fence is the holder's fencing token.
	Fence uint64
	// TTL is how long the lock lives from now without a refresh, by the
	// store's clock.
	TTL time.Duration
	// Waiters counts acquisitions queued in the store (queueing backends
	// only: elsewhere waiters leave no trace in the store).
	Waiters int
	// Queue lists the queued waiters' labels, next first.
	Queue []string
	// Known says which fields the store reported.
	Known Fields
}

// Fields is a set of State fields; see the Knows constants.
type Fields = backend.Fields

// The State fields a store may report.
const (
	KnowsOwner   = backend.KnowsOwner
	KnowsFence   = backend.KnowsFence
	KnowsTTL     = backend.KnowsTTL
	KnowsWaiters = backend.KnowsWaiters
	KnowsQueue   = backend.KnowsQueue
)

func (c *Client) state(s backend.State) State {
	return State{
		Name: strings.TrimPrefix(s.Key, c.cfg.namespace+"/"), Held: s.Held, Owner: s.Owner,
		Fence: s.Fence, TTL: s.TTL, Waiters: s.Waiters, Queue: s.Queue, Known: s.Known,
	}
}

// Inspect reports what the store knows about the lock name, without
// changing it. It returns ErrUnsupported when the backend cannot read a
// lock's state.
func (c *Client) Inspect(ctx context.Context, name string) (State, error) {
	const op = "inspect"
	if err := CheckName(name); err != nil {
		return State{}, fmt.Errorf("locker: %s: %w", op, err)
	}
	in, ok := backend.As[backend.Inspector](c.drv)
	if !ok {
		return State{}, fmt.Errorf("locker: %s %q: %w: the backend cannot read a lock's state", op, name, ErrUnsupported)
	}
	s, err := inspectCall(c, ctx, func(ctx context.Context) (backend.State, error) {
		return in.Inspect(ctx, backend.Key(c.cfg.namespace, name))
	})
	if err != nil {
		return State{}, fmt.Errorf("locker: %s %q: %w", op, name, err)
	}
	return c.state(s), nil
}

// List reports every held lock of the Client's namespace whose name
// starts with prefix ("" for all), sorted by name. It returns
// ErrUnsupported when the store cannot enumerate its keys (memcached).
func (c *Client) List(ctx context.Context, prefix string) ([]State, error) {
	const op = "list"
	if err := CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("locker: %s: %w", op, err)
	}
	li, ok := backend.As[backend.Lister](c.drv)
	if !ok {
		return nil, fmt.Errorf("locker: %s: %w: the backend cannot enumerate its locks", op, ErrUnsupported)
	}
	ss, err := inspectCall(c, ctx, func(ctx context.Context) ([]backend.State, error) {
		return li.List(ctx, backend.Key(c.cfg.namespace, prefix))
	})
	if err != nil {
		return nil, fmt.Errorf("locker: %s %q: %w", op, prefix, err)
	}
	out := make([]State, len(ss))
	for i, s := range ss {
		out[i] = c.state(s)
	}
	return out, nil
}

// ForceRelease frees the lock name if its holder's fence is fence (as
// Inspect reported it), and returns that holder's state. It is the
// operator's break-glass for a lock whose holder is stuck, and never makes
// two holders look legitimate: the next holder's fence is above fence,
// and the removed holder learns of the loss by its next refresh (its Lost
// channel closes). It returns ErrNotHeld, and changes nothing, when the
// lock is free or held under another fence; ErrUnsupported when the
// backend cannot remove another client's lock.
func (c *Client) ForceRelease(ctx context.Context, name string, fence uint64) (State, error) {
	const op = "force-release"
	if err := CheckName(name); err != nil {
		return State{}, fmt.Errorf("locker: %s: %w", op, err)
	}
	br, ok := backend.As[backend.Breaker](c.drv)
	if !ok {
		return State{}, fmt.Errorf("locker: %s %q: %w: the backend cannot remove another client's lock", op, name, ErrUnsupported)
	}
	s, err := inspectCall(c, ctx, func(ctx context.Context) (backend.State, error) {
		return br.Break(ctx, backend.Key(c.cfg.namespace, name), fence)
	})
	if err != nil {
		return State{}, fmt.Errorf("locker: %s %q fence %d: %w", op, name, fence, err)
	}
	return c.state(s), nil
}

// holderLookup bounds the look at who holds a lock for a refusal's
// message: a wait that ran out of time returns late by at most that, as a
// driver may after a context ends (backend.CancelGrace).
const holderLookup = backend.CancelGrace

// heldBy describes, for the message of a refusal of req, the holder the
// store records: ` (held by "host:1234", fence 7)`; "" when the store
// cannot say (no Inspector, not a lock, no answer within holderLookup) or
// the caller gave up. It runs after ctx's deadline too, when the deadline
// ended a wait: the message is for the one who set it.
func (c *Client) heldBy(ctx context.Context, req backend.Claim) string {
	in, ok := backend.As[backend.Inspector](c.drv)
	if !ok || req.Mode != backend.Exclusive || errors.Is(ctx.Err(), context.Canceled) {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holderLookup)
	defer cancel()
	s, err := guard(c, ctx, func(ctx context.Context) (backend.State, error) { return in.Inspect(ctx, req.Key) }, nil)
	if err != nil || !s.Held || !s.Known.Has(KnowsOwner) {
		return ""
	}
	by := fmt.Sprintf(" (held by %q", s.Owner)
	if s.Known.Has(KnowsFence) {
		by += fmt.Sprintf(", fence %d", s.Fence)
	}
	return by + ")"
}

// inspectCall runs an operator's driver call through the Client's gate,
// guarded like every other driver call.
func inspectCall[T any](c *Client, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	ctx, end, err := c.gate.Enter(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer end()
	return guard(c, ctx, f, nil)
}
