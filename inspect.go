package locker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// State is what the store knows about a lock, a semaphore or a
// read-write lock now: the answer of Inspect, List and ForceRelease. For a
// lock, Owner, Fence and TTL describe its holder; for a semaphore or a
// read-write lock, Holders lists its permits, readers and writer. Held is
// always known; each other field means something only when Known has its
// bit (see backend.State for who knows what, and the backend table in the
// repository's docs/backends.md).
type State struct {
	// Name is the lock's name, without the Client's namespace.
	Name string
	// Held: someone holds the lock (a permit, a reader or the writer)
	// and, where locks expire, its TTL has not run out.
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
	// Limit is a semaphore's limit, as its holders' Semaphore options
	// gave it.
	Limit int
	// Holders are a semaphore's or a read-write lock's holders, by fence,
	// lowest first. Each holder's Owner and TTL are known with
	// KnowsOwner and KnowsTTL.
	Holders []Holder
	// Known says which fields the store reported.
	Known Fields
}

// Holder is one holder of a semaphore or a read-write lock.
type Holder struct {
	// Owner is the holder's label.
	Owner string
	// Fence is the holder's fencing token: ForceRelease frees this one
	// holder by it.
	Fence uint64
	// TTL is how long the holder's grant lives from now without a
	// refresh, by the store's clock.
	TTL time.Duration
	// Weight is how many permits the holder has (see Permits); 1 for a
	// reader or the writer.
	Weight int
	// Write: the holder is a read-write lock's writer.
	Write bool
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
	KnowsLimit   = backend.KnowsLimit
	KnowsHolders = backend.KnowsHolders
)

func (c *Client) state(s backend.State) State {
	st := State{
		Name: strings.TrimPrefix(s.Key, c.cfg.namespace+"/"), Held: s.Held, Owner: s.Owner,
		Fence: s.Fence, TTL: s.TTL, Waiters: s.Waiters, Queue: s.Queue, Limit: s.Limit, Known: s.Known,
	}
	if len(s.Holders) > 0 {
		st.Holders = make([]Holder, len(s.Holders))
		for i, h := range s.Holders {
			st.Holders[i] = Holder{Owner: h.Owner, Fence: h.Fence, TTL: h.TTL, Weight: h.Weight, Write: h.Mode == backend.Write}
		}
		slices.SortFunc(st.Holders, func(a, b Holder) int { return cmp.Compare(a.Fence, b.Fence) })
	}
	return st
}

// selected returns the object that opts select for an operator's call, and
// its noun for messages: the lock, or with Semaphore (whatever its limit)
// the semaphore, or with Read or Write the read-write lock. Other
// options do not matter there.
func selected(opts []LockOption) (backend.Mode, string) {
	var lc lockConfig
	switch m := backend.Object(lc.with(opts).mode); m {
	case backend.Permit:
		return m, "semaphore"
	case backend.Read:
		return m, "read-write lock"
	default:
		return backend.Exclusive, "lock"
	}
}

// Inspect reports what the store knows about the lock name, without
// changing it; with Semaphore(n) among opts (n does not matter), about the
// semaphore name and each of its permits' holders; with Read() or Write(),
// about the read-write lock name and each of its readers and its writer.
// It returns ErrUnsupported when the backend cannot read that object's
// state.
func (c *Client) Inspect(ctx context.Context, name string, opts ...LockOption) (State, error) {
	const op = "inspect"
	if err := CheckName(name); err != nil {
		return State{}, fmt.Errorf("locker: %s: %w", op, err)
	}
	m, noun := selected(opts)
	in, ok := backend.As[backend.Inspector](c.drv)
	if !ok {
		return State{}, fmt.Errorf("locker: %s %q: %w: the backend cannot read a %s's state", op, name, ErrUnsupported, noun)
	}
	s, err := inspectCall(c, ctx, func(ctx context.Context) (backend.State, error) {
		return in.Inspect(ctx, backend.Key(c.cfg.namespace, name), m)
	})
	if err != nil {
		return State{}, fmt.Errorf("locker: %s %s %q: %w", op, noun, name, err)
	}
	return c.state(s), nil
}

// List reports every held lock of the Client's namespace whose name
// starts with prefix ("" for all), sorted by name; with Semaphore(n) or
// Read() among opts, every held semaphore or read-write lock, as Inspect
// does. It returns ErrUnsupported when the store cannot enumerate its keys
// (memcached).
func (c *Client) List(ctx context.Context, prefix string, opts ...LockOption) ([]State, error) {
	const op = "list"
	if err := CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("locker: %s: %w", op, err)
	}
	m, noun := selected(opts)
	li, ok := backend.As[backend.Lister](c.drv)
	if !ok {
		return nil, fmt.Errorf("locker: %s: %w: the backend cannot enumerate its %ss", op, ErrUnsupported, noun)
	}
	ss, err := inspectCall(c, ctx, func(ctx context.Context) ([]backend.State, error) {
		return li.List(ctx, backend.Key(c.cfg.namespace, prefix), m)
	})
	if err != nil {
		return nil, fmt.Errorf("locker: %s %q: %w", op, prefix, err)
	}
	out := make([]State, len(ss))
	for i, s := range ss {
		out[i] = c.state(s)
	}
	slices.SortFunc(out, func(a, b State) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ForceRelease frees the lock name if its holder's fence is fence (as
// Inspect reported it), and returns that holder's state; with
// Semaphore(n) or Read() among opts, it frees the one permit, reader or
// writer of the semaphore or read-write lock name whose fence is fence,
// and the others keep theirs. It is the operator's break-glass for a
// holder that is stuck, and never makes two holders look legitimate: the
// next grant's fence is above fence, and the removed holder learns of the
// loss by its next refresh (its Lost channel closes). It returns
// ErrNotHeld, and changes nothing, when no holder has that fence;
// ErrUnsupported when the backend cannot remove another client's holder.
func (c *Client) ForceRelease(ctx context.Context, name string, fence uint64, opts ...LockOption) (State, error) {
	const op = "force-release"
	if err := CheckName(name); err != nil {
		return State{}, fmt.Errorf("locker: %s: %w", op, err)
	}
	m, noun := selected(opts)
	br, ok := backend.As[backend.Breaker](c.drv)
	if !ok {
		return State{}, fmt.Errorf("locker: %s %q: %w: the backend cannot remove another client's %s holder", op, name, ErrUnsupported, noun)
	}
	s, err := inspectCall(c, ctx, func(ctx context.Context) (backend.State, error) {
		return br.Break(ctx, backend.Key(c.cfg.namespace, name), m, fence)
	})
	if err != nil {
		return State{}, fmt.Errorf("locker: %s %s %q fence %d: %w", op, noun, name, fence, err)
	}
	return c.state(s), nil
}

// Resize sets the limit of the semaphore name to limit, 1 to MaxLimit,
// while it is in use, until the next Resize; limit 0 removes the limit
// Resize set. While one stands, every acquisition of the semaphore is
// judged under it, whatever its Semaphore(n) says (a claim of more
// Permits than it fails with ErrLimitMismatch), and holders above a
// lowered limit keep their permits until they release: new grants wait
// until the holders are within it. A raised limit lets waiters in at
// once. The store keeps the limit without expiry, one record per resized
// semaphore, until Resize(ctx, name, 0), after which acquisitions' own
// limits rule again. It returns ErrInvalidLimit for
// a limit out of range, and ErrUnsupported when the backend cannot keep
// a limit, before any network call.
func (c *Client) Resize(ctx context.Context, name string, limit int) error {
	const op = "resize"
	if err := CheckName(name); err != nil {
		return fmt.Errorf("locker: %s: %w", op, err)
	}
	if limit != 0 {
		if err := CheckLimit(limit); err != nil {
			return fmt.Errorf("locker: %s %q: %w", op, name, err)
		}
	}
	rs, ok := backend.As[backend.Resizer](c.drv)
	if !ok {
		return fmt.Errorf("locker: %s %q: %w: the backend cannot keep a semaphore's limit", op, name, ErrUnsupported)
	}
	_, err := inspectCall(c, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, rs.Resize(ctx, backend.Key(c.cfg.namespace, name), limit)
	})
	if err != nil {
		return fmt.Errorf("locker: %s %q to %d: %w", op, name, limit, err)
	}
	c.released(objectOf(backend.Key(c.cfg.namespace, name), backend.Permit)) // a raised limit: this Client's waiters try
	return nil
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
	s, err := guard(c, ctx, func(ctx context.Context) (backend.State, error) { return in.Inspect(ctx, req.Key, backend.Exclusive) }, nil)
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
