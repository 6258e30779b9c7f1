package pglock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockerhq/locker/internal/conntrack"
)

// Presence: a release notifies only when someone waits for its key, since
// a notification costs the release about a third of its time. A waiter's
// driver holds a shared session-level advisory lock on the key, on one
// connection of its own, and a release notifies unless it can take that
// lock exclusively (notifyIfPresent; the whole protocol, and how a broken
// connection is recovered, is in docs/backends/pglock.md).

// presenceLinger is how long a key stays present after its last waiter.
const presenceLinger = time.Second

type presence struct {
	d *Driver

	// mu (full: held) is held across the connection's statements, a
	// channel so that a waiter's wait for it ends with its context; rmu
	// (taken after mu when both are) guards keys and their counts, so that
	// a waiter that leaves never waits for a statement.
	mu      chan struct{}
	closed  bool
	conn    *pgx.Conn
	socks   *conntrack.Tracker
	sweeper bool // a goroutine unlocks the keys nobody waits for
	wg      sync.WaitGroup

	rmu  sync.Mutex
	keys map[string]*presentKey
}

type presentKey struct {
	refs int         // waiters (rmu)
	idle time.Time   // since refs went to 0 (rmu)
	held atomic.Bool // the lock is held on conn (set under mu)
}

// hold makes key present for a waiter until drop is called; ok false
// when the connection cannot be had (the waiter then relies on its
// timer). ctx bounds the wait for the connection and the lock.
func (p *presence) hold(ctx context.Context, key string) (drop func(), ok bool) {
	p.rmu.Lock()
	if p.keys == nil {
		p.keys = map[string]*presentKey{}
	}
	k := p.keys[key]
	if k == nil {
		k = &presentKey{}
		p.keys[key] = k
	}
	k.refs++
	p.rmu.Unlock()
	drop = sync.OnceFunc(func() {
		p.rmu.Lock()
		defer p.rmu.Unlock()
		if k.refs--; k.refs == 0 {
			k.idle = time.Now()
		}
	})
	if k.held.Load() {
		// Present already (the sweeper, which runs while any key is
		// left, sees the count before it unlocks).
		return drop, true
	}
	select {
	case p.mu <- struct{}{}:
	case <-ctx.Done():
		return drop, false
	}
	defer p.unlock()
	if p.closed {
		return drop, false
	}
	if !p.sweeper {
		p.sweeper = true
		p.wg.Add(1)
		go p.sweep()
	}
	if k.held.Load() {
		return drop, true
	}
	if p.conn == nil && !p.connectLocked(ctx) {
		return drop, false
	}
	return drop, p.lockLocked(ctx, key, k)
}

// waiting returns the keys with waiters whose lock is not held. mu is
// held.
func (p *presence) waiting() map[string]*presentKey {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	out := map[string]*presentKey{}
	for key, k := range p.keys {
		if k.refs > 0 && !k.held.Load() {
			out[key] = k
		}
	}
	return out
}

// connectLocked opens the connection and takes the lock of every key
// with waiters (they lost it with the last connection), then wakes every
// subscriber. mu is held.
func (p *presence) connectLocked(ctx context.Context) bool {
	socks := conntrack.New()
	conn, err := p.d.connectOutside(ctx, socks)
	if err != nil {
		return false
	}
	p.conn, p.socks = conn, socks
	return p.relockLocked(ctx)
}

// relockLocked takes the lock of every key with waiters that lacks it,
// then wakes every subscriber if there were any. mu is held.
func (p *presence) relockLocked(ctx context.Context) bool {
	lost := p.waiting()
	for key, k := range lost {
		if !p.lockLocked(ctx, key, k) {
			return false
		}
	}
	if len(lost) > 0 {
		p.d.lis.wakeAll()
	}
	return true
}

// lockLocked takes key's lock on the connection; on failure it closes the
// connection (every key's lock goes with it). mu is held.
func (p *presence) lockLocked(ctx context.Context, key string, k *presentKey) bool {
	if _, err := p.conn.Exec(ctx, p.d.sql.presenceLock, p.d.sql.presenceClass, key); err != nil {
		p.dropConnLocked()
		return false
	}
	k.held.Store(true)
	return true
}

func (p *presence) dropConnLocked() {
	if p.conn == nil {
		return
	}
	p.socks.Cut()
	conn := p.conn
	p.conn, p.socks = nil, nil
	p.rmu.Lock()
	for _, k := range p.keys {
		k.held.Store(false)
	}
	p.rmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(ctx)
	cancel()
}

// idleKeys returns, and forgets, the keys nobody waited for in
// presenceLinger, and whether any key is left. mu is held.
func (p *presence) idleKeys() (map[string]*presentKey, bool) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	now := time.Now()
	out := map[string]*presentKey{}
	for key, k := range p.keys {
		if k.refs == 0 && now.Sub(k.idle) >= presenceLinger {
			out[key] = k
			delete(p.keys, key)
		}
	}
	return out, len(p.keys) > 0
}

// sweep unlocks the keys that nobody waited for in presenceLinger, checks
// the connection, brings it back for the keys with waiters, and ends when
// no key is left.
func (p *presence) sweep() {
	defer p.wg.Done()
	gctx := p.d.gate.Context()
	t := time.NewTicker(presenceLinger / 4)
	defer t.Stop()
	for {
		select {
		case <-gctx.Done():
			return
		case <-t.C:
		}
		select {
		case p.mu <- struct{}{}:
		case <-gctx.Done():
			return
		}
		idle, left := p.idleKeys()
		for key, k := range idle {
			if k.held.Load() && p.conn != nil {
				ctx, cancel := context.WithTimeout(gctx, 5*time.Second)
				_, err := p.conn.Exec(ctx, p.d.sql.presenceUnlock, p.d.sql.presenceClass, key)
				cancel()
				if err != nil {
					p.dropConnLocked()
				}
			}
		}
		ctx, cancel := context.WithTimeout(gctx, 10*time.Second)
		if p.conn != nil && left && p.conn.Ping(ctx) != nil {
			// The server ended the connection (terminated, restarted)
			// and the keys' locks with it, which no statement of ours
			// noticed: releases went unannounced since.
			p.dropConnLocked()
		}
		if p.conn == nil {
			if len(p.waiting()) > 0 {
				p.connectLocked(ctx)
			}
		} else {
			p.relockLocked(ctx)
		}
		cancel()
		if !left {
			p.dropConnLocked()
			p.sweeper = false
			p.unlock()
			return
		}
		p.unlock()
	}
}

func (p *presence) unlock() { <-p.mu }

// close ends the sweeper and the connection; Close ended the gate's
// context before, which ends a statement in flight.
func (p *presence) close() {
	p.mu <- struct{}{}
	p.closed = true
	p.unlock()
	p.wg.Wait()
	p.mu <- struct{}{}
	p.dropConnLocked()
	p.unlock()
}
