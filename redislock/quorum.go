package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Quorum is the Redlock algorithm over N independent Redis servers (not
// replicas of each other): a lock is held when a majority of them granted
// it, within its validity. It implements backend.Driver and
// backend.Notifier.
//
// Validity. Every server is asked for the lock with an expiry of
// px = TTL/(1-drift factor) + fixed drift (about TTL + 1% + 2ms by
// default), starting at t0, before the first request is sent. A server
// whose clock runs at most the drift factor slow of ours still keeps the key
// until t0 + TTL on our clock, so the lock is valid until t0 + TTL: the
// Grant reports the requested TTL, and an acquisition that took longer than
// that (px - elapsed - drift allowance <= 0) fails and cleans up.
//
// Fencing. Each server keeps its own counter, advanced by the acquire
// script when it grants. An acquisition's fence F is the highest value that
// a granting server returned, and before the acquisition succeeds every
// granting server whose counter is below F is raised to F, by a script that
// first checks the token still holds the lock there. The lock is held only
// when a majority M of servers granted it and now has counter >= F. Why the
// next holder's fence is greater: its own majority M' shares a server s
// with M. On s, the next holder's SET NX succeeded only after this holder's
// key on s was gone, which is after s's counter reached F (the raise ran
// while the key was there), so its INCR on s yields more than F, and its
// fence, the maximum over M', is more than F. When all granting servers
// returned F already, which is the steady state once they agree, no raise
// round trip is needed.
type Quorum struct {
	nodes  []*node
	addrs  []string // for error messages
	quorum int
	cfg    config
	closed atomic.Bool
}

var (
	_ backend.Driver   = (*Quorum)(nil)
	_ backend.Notifier = (*Quorum)(nil)
)

// NewQuorum returns a Quorum over clients, one per independent server
// (plain *redis.Client values, not replicas of one another; an odd number,
// usually 3 or 5). Close does not close them.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) (*Quorum, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("redislock: quorum: %w: no servers", backend.ErrUnsupported)
	}
	cfg := buildConfig(opts)
	q := &Quorum{quorum: len(clients)/2 + 1, cfg: cfg}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redislock: quorum: %w: client %d is nil", backend.ErrUnsupported, i)
		}
		n := newNode(c, false, &cfg)
		q.nodes = append(q.nodes, n)
		q.addrs = append(q.addrs, clientAddr(c, i))
	}
	for i, n := range q.nodes {
		n.checkMaxmemoryAsync(q.addrs[i])
	}
	return q, nil
}

func clientAddr(c redis.UniversalClient, i int) string {
	if cl, ok := c.(*redis.Client); ok {
		return cl.Options().Addr
	}
	return fmt.Sprintf("server %d", i+1)
}

// Quorum returns how many servers must grant a lock: a majority.
func (q *Quorum) Quorum() int { return q.quorum }

// px is the expiry asked of each server (see the type's comment).
func (q *Quorum) px(ttl time.Duration) int64 {
	stretched := time.Duration(float64(ttl)/(1-q.cfg.driftFactor)) + q.cfg.driftMin
	return ttlMillis(max(stretched, ttl))
}

type result struct {
	ok    bool
	fence uint64
	err   error
}

// each runs fn on every server concurrently and returns the results in
// server order.
func (q *Quorum) each(ctx context.Context, fn func(ctx context.Context, n *node) (bool, uint64, error)) []result {
	res := make([]result, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, f, err := fn(ctx, n)
			res[i] = result{ok: ok, fence: f, err: err}
		}()
	}
	wg.Wait()
	return res
}

// errSummary lists the servers' errors, for a message that says what failed.
func (q *Quorum) errSummary(res []result) string {
	var parts []string
	for i, r := range res {
		if r.err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", q.addrs[i], r.err))
		}
	}
	return strings.Join(parts, "; ")
}

// TryAcquire implements backend.Driver: the lock is acquired on every
// server, and held when a majority granted it within its validity. Any
// failure releases it everywhere, so nothing stays held.
//
// Contenders that try at the same moment can split the vote so that none
// has a majority. Such an attempt (some servers granted, a majority
// answered, too few granted) is released and tried again after a short
// random pause, at most splitRetries times, so that of simultaneous tries
// on a free lock one wins, as with a single server.
func (q *Quorum) TryAcquire(ctx context.Context, l backend.Lock) (backend.Grant, error) {
	if q.closed.Load() {
		return backend.Grant{}, fmt.Errorf("redislock: quorum: try-acquire: %w", backend.ErrClosed)
	}
	for attempt := 1; ; attempt++ {
		g, split, err := q.tryOnce(ctx, l)
		if !split || attempt > splitRetries || ctx.Err() != nil {
			return g, err
		}
		t := time.NewTimer(rand.N(time.Duration(attempt) * 2 * time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return g, err
		}
	}
}

const splitRetries = 3

func (q *Quorum) tryOnce(ctx context.Context, l backend.Lock) (_ backend.Grant, split bool, _ error) {
	px := q.px(l.TTL)
	ttl := time.Duration(ttlMillis(l.TTL)) * time.Millisecond
	t0 := time.Now()
	deadline := t0.Add(ttl)
	// A server that has not answered by the end of the validity is of no
	// use to this acquisition.
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	res := q.each(actx, func(ctx context.Context, n *node) (bool, uint64, error) {
		f, err := n.acquire(ctx, l, px)
		return f > 0, f, err
	})
	granted, denied := 0, 0
	var fence uint64
	for _, r := range res {
		switch {
		case r.err != nil:
		case r.ok:
			granted++
			fence = max(fence, r.fence)
		default:
			denied++
		}
	}
	if granted < q.quorum {
		q.abandon(ctx, l)
		if granted+denied >= q.quorum {
			// Enough servers answered to decide: another token holds it,
			// or contenders split the vote.
			return backend.Grant{}, granted > 0, fmt.Errorf("redislock: quorum: try-acquire: %w (%d of %d servers granted, %d needed)",
				backend.ErrNotAcquired, granted, len(q.nodes), q.quorum)
		}
		return backend.Grant{}, false, fmt.Errorf("redislock: quorum: try-acquire: only %d of %d servers answered, %d needed: %s",
			granted+denied, len(q.nodes), q.quorum, q.errSummary(res))
	}

	// Raise the counters of the granting servers that are below the fence
	// (see the type's comment for why).
	confirmed, lostRace := 0, false
	var raiseErr error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, r := range res {
		if r.ok && r.err == nil && r.fence == fence {
			confirmed++
		}
	}
	for i, r := range res {
		if !r.ok || r.err != nil || r.fence == fence {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := q.nodes[i].raise(actx, l, fence)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if raiseErr == nil {
					raiseErr = fmt.Errorf("%s: %w", q.addrs[i], err)
				}
			case ok:
				confirmed++
			default:
				lostRace = true
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	switch {
	case confirmed < q.quorum && lostRace:
		q.abandon(ctx, l)
		return backend.Grant{}, false, fmt.Errorf("redislock: quorum: try-acquire: %w: the lock expired on a server during the acquisition", backend.ErrNotAcquired)
	case confirmed < q.quorum:
		q.abandon(ctx, l)
		return backend.Grant{}, false, fmt.Errorf("redislock: quorum: try-acquire: raising the fence on %d of %d servers failed: %w", q.quorum-confirmed, q.quorum, raiseErr)
	case elapsed >= ttl:
		q.abandon(ctx, l)
		return backend.Grant{}, false, fmt.Errorf("redislock: quorum: try-acquire: %w: acquiring took %v, its whole validity", backend.ErrNotAcquired, elapsed.Round(time.Millisecond))
	}
	return backend.Grant{Fence: fence, TTL: ttl}, false, nil
}

// abandon releases a failed acquisition on every server, including those
// that did not answer: they may have granted it.
func (q *Quorum) abandon(ctx context.Context, l backend.Lock) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	q.each(ctx, func(ctx context.Context, n *node) (bool, uint64, error) {
		ok, err := n.release(ctx, l)
		return ok, 0, err
	})
}

// Refresh implements backend.Driver: it extends the lock on every server
// that holds it for the token, and succeeds when a majority did. It reports
// ErrNotHeld when so many servers show it free or another token's that no
// majority can hold it.
func (q *Quorum) Refresh(ctx context.Context, l backend.Lock) error {
	if q.closed.Load() {
		return fmt.Errorf("redislock: quorum: refresh: %w", backend.ErrClosed)
	}
	px := q.px(l.TTL)
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(ctx, l.TTL)
	defer cancel()
	res := q.each(rctx, func(ctx context.Context, n *node) (bool, uint64, error) {
		ok, err := n.refresh(ctx, l, px)
		return ok, 0, err
	})
	ok, notHeld := count(res)
	switch {
	case ok >= q.quorum && time.Since(t0) < l.TTL:
		return nil
	case notHeld > len(q.nodes)-q.quorum:
		return fmt.Errorf("redislock: quorum: refresh: %w (%d of %d servers hold it, %d needed)", backend.ErrNotHeld, ok, len(q.nodes), q.quorum)
	case ok >= q.quorum:
		return fmt.Errorf("redislock: quorum: refresh: took %v, longer than the TTL", time.Since(t0).Round(time.Millisecond))
	default:
		return fmt.Errorf("redislock: quorum: refresh: %d of %d servers confirmed, %d needed: %s", ok, len(q.nodes), q.quorum, q.errSummary(res))
	}
}

// Release implements backend.Driver: it releases the lock on every server.
// It reports ErrNotHeld when no majority held it for the token.
func (q *Quorum) Release(ctx context.Context, l backend.Lock) error {
	if q.closed.Load() {
		return fmt.Errorf("redislock: quorum: release: %w", backend.ErrClosed)
	}
	res := q.each(ctx, func(ctx context.Context, n *node) (bool, uint64, error) {
		ok, err := n.release(ctx, l)
		return ok, 0, err
	})
	ok, notHeld := count(res)
	switch {
	case ok >= q.quorum:
		return nil
	case notHeld > len(q.nodes)-q.quorum:
		return fmt.Errorf("redislock: quorum: release: %w (%d of %d servers held it)", backend.ErrNotHeld, ok, len(q.nodes))
	default:
		return fmt.Errorf("redislock: quorum: release: %d of %d servers confirmed, %d needed: %s", ok, len(q.nodes), q.quorum, q.errSummary(res))
	}
}

func count(res []result) (ok, notOK int) {
	for _, r := range res {
		switch {
		case r.err != nil:
		case r.ok:
			ok++
		default:
			notOK++
		}
	}
	return ok, notOK
}

// Subscribe implements backend.Notifier: it subscribes on every server and
// succeeds when a majority confirmed. A release reaches a majority too, so
// at least one subscribed server sees it.
func (q *Quorum) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if q.closed.Load() {
		return nil, nil, fmt.Errorf("redislock: quorum: subscribe: %w", backend.ErrClosed)
	}
	ch := make(chan struct{}, 1)
	cancels := make([]func(), len(q.nodes))
	res := make([]result, len(q.nodes))
	var wg sync.WaitGroup
	for i, n := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := n.subscribe(ctx, key, ch)
			cancels[i], res[i] = c, result{ok: err == nil, err: err}
		}()
	}
	wg.Wait()
	cancel := func() {
		for _, c := range cancels {
			if c != nil {
				c()
			}
		}
	}
	if ok, _ := count(res); ok < q.quorum {
		cancel()
		return nil, nil, fmt.Errorf("redislock: quorum: subscribe: %d of %d servers confirmed, %d needed: %s", ok, len(q.nodes), q.quorum, q.errSummary(res))
	}
	var once sync.Once
	return ch, func() { once.Do(cancel) }, nil
}

// Close implements backend.Driver. It closes the clients only if OpenQuorum
// or locker.Open created them.
func (q *Quorum) Close() error {
	if q.closed.Swap(true) {
		return fmt.Errorf("redislock: quorum: close: %w", backend.ErrClosed)
	}
	var errs []error
	for _, n := range q.nodes {
		if err := n.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
