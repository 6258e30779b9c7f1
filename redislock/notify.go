package redislock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// Subscribe implements backend.Notifier over Redis pub/sub.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if d.gate.Closed() {
		return nil, nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	ch := make(chan struct{}, 1)
	_, cancel, err := d.dep.subscribe(ctx, key, "", ch)
	if err != nil {
		return nil, nil, err
	}
	// A release publishes only when marked (see watchMark); the mark
	// comes after the subscription, so that no release after it is missed.
	unmark, err := d.dep.mark(ctx, key, ch)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return ch, func() { unmark(); cancel() }, nil
}

// A release publishes a wake-up only when the lock's {E}:live hash exists
// (handoff_release.lua): queued waiters have entries there, and a watcher
// (Subscribe) a field of its own, watchField, renewed while it watches. So
// a release nobody waits for or watches costs no PUBLISH, which a cluster
// sends to every node.

// watchField is the watchers' field of {E}:live (no waiter is named so).
const watchField = "~watch"

// watchEvery renews a mark that lives 2*livenessTTL, as waiters' entries.
const watchEvery = livenessTTL / 2

var watchScript = newScript(`redis.call('HSET', KEYS[1], ARGV[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// watchMark is one key's mark: its watchers' channels, woken when a renewal
// failed or came late (a release may have gone unpublished).
type watchMark struct {
	chans map[chan struct{}]struct{}
	ok    time.Time // last renewal that succeeded
}

// mark puts key's mark in place until stop, waking ch whenever it may have
// lapsed. The first is written before mark returns, so that no release
// after Subscribe goes unpublished.
func (dep *deployment) mark(ctx context.Context, key string, ch chan struct{}) (stop func(), err error) {
	live := keysFor(key).live
	sent := time.Now()
	if err := dep.writeMark(ctx, live); err != nil {
		return nil, fmt.Errorf("redislock: subscribe: %w", err)
	}
	dep.mu.Lock()
	defer dep.mu.Unlock()
	if dep.closed {
		return nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	m := dep.marks[live]
	if m == nil {
		m = &watchMark{chans: map[chan struct{}]struct{}{}, ok: sent}
		dep.marks[live] = m
		dep.wg.Go(func() { dep.renewMark(live, m) })
	}
	m.chans[ch] = struct{}{}
	return sync.OnceFunc(func() {
		dep.mu.Lock()
		delete(m.chans, ch)
		dep.mu.Unlock()
	}), nil
}

func (dep *deployment) writeMark(ctx context.Context, live string) error {
	return classify(dep.run(ctx, watchScript, []string{live}, watchField, (2 * livenessTTL).Milliseconds()).Err())
}

// renewMark renews m until it has no watchers or dep closes.
func (dep *deployment) renewMark(live string, m *watchMark) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	lapsed := false
	for {
		select {
		case <-dep.ctx.Done():
			return
		case <-t.C:
		}
		dep.mu.Lock()
		if len(m.chans) == 0 {
			delete(dep.marks, live)
			dep.mu.Unlock()
			return
		}
		dep.mu.Unlock()
		sent := time.Now()
		ctx, cancel := context.WithTimeout(dep.ctx, watchEvery)
		err := dep.writeMark(ctx, live)
		cancel()
		dep.mu.Lock()
		// The mark lives 2*livenessTTL from the last write that landed,
		// sent at m.ok or later.
		lapsed = lapsed || err != nil || time.Since(m.ok) >= 2*livenessTTL
		if err == nil {
			m.ok = sent
			if lapsed {
				for ch := range m.chans {
					backend.Notify(ch)
				}
				lapsed = false
			}
		}
		dep.mu.Unlock()
	}
}

// A hub is one pub/sub connection and the goroutine that reads it: one for
// every channel of a plain client or a cluster (PUBLISH reaches every node
// of a cluster), one per channel of a ring (routed to its shard). A channel
// stays subscribed for a moment (linger) after its last waiter leaves, so
// that a busy lock costs no SUBSCRIBE per acquisition; a hub without
// channels closes.
type hub struct {
	dep   *deployment
	route string
	ps    *redis.PubSub
	wmu   chan struct{} // held (full) while writing SUBSCRIBE, UNSUBSCRIBE or PING, to order them

	// Guarded by dep.mu.
	chans    map[string]*chanState
	dead     bool
	quit     chan struct{}         // closed when dead is set
	epoch    uint64                // advanced whenever the connection failed
	barriers map[uint64]chan error // PING payload -> its waiter (buffered 1)
}

type chanState struct {
	subs    map[*subscription]struct{}
	active  bool        // confirmed subscribed on the current connection
	stale   bool        // was subscribed on a connection that failed: a value is owed to subs once subscribed again
	idle    *time.Timer // linger before UNSUBSCRIBE, when subs is empty
	idleGen uint64      // which linger idle is
}

type subscription struct {
	ch chan struct{}
	id string // a waiter's name: woken only by messages naming it or none
	// handed are the hand-offs to id received, oldest first; under dep.mu.
	handed []handoff
}

// handoff is a hand-off message: the lock went to attempt under fence.
type handoff struct {
	attempt, fence uint64
}

// parseHandoff reads a hand-off message, "!<attempt>:<fence>:<waiter>".
func parseHandoff(payload string) (id string, h handoff, ok bool) {
	rest, ok := strings.CutPrefix(payload, "!")
	a, rest, ok1 := strings.Cut(rest, ":")
	f, id, ok2 := strings.Cut(rest, ":")
	var err1, err2 error
	h.attempt, err1 = strconv.ParseUint(a, 10, 64)
	h.fence, err2 = strconv.ParseUint(f, 10, 64)
	return id, h, ok && ok1 && ok2 && err1 == nil && err2 == nil
}

// maxHanded bounds a subscription's list: only the latest matter.
const maxHanded = 8

// addHanded records a hand-off to s; dep.mu must be held.
func (s *subscription) addHanded(h handoff) {
	if len(s.handed) == maxHanded {
		s.handed = slices.Delete(s.handed, 0, 1)
	}
	s.handed = append(s.handed, h)
}

// subscribe has ch receive a value whenever key's release channel carries
// a message naming waiter id or no one (id "": any message), once the
// subscription is confirmed; its handed list receives the hand-offs to id.
func (dep *deployment) subscribe(ctx context.Context, key, id string, ch chan struct{}) (*subscription, func(), error) {
	channel := keysFor(key).channel
	route := dep.route(channel)
	sub := &subscription{ch: ch, id: id}
	var h *hub
	for {
		dep.mu.Lock()
		if h = dep.hubs[route]; dep.closed || h != nil && !h.dead {
			break
		}
		dep.mu.Unlock()
		// Make the connection object outside the lock: for a ring it
		// already subscribes.
		ps := dep.pubSub(ctx, route)
		dep.mu.Lock()
		if cur := dep.hubs[route]; dep.closed || cur != nil && !cur.dead {
			dep.mu.Unlock()
			_ = ps.Close()
			continue
		}
		h = &hub{dep: dep, route: route, ps: ps, chans: map[string]*chanState{}, barriers: map[uint64]chan error{}, quit: make(chan struct{}), wmu: make(chan struct{}, 1)}
		dep.hubs[route] = h
		dep.wg.Go(h.run)
		dep.wg.Go(h.check)
		break
	}
	if dep.closed {
		dep.mu.Unlock()
		return nil, nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	st := h.add(channel, sub)
	active := st.active
	dep.mu.Unlock()

	cancel := sync.OnceFunc(func() { dep.unsubscribe(h, channel, st, sub) })
	if !active {
		if err := h.confirm(ctx, channel, st); err != nil {
			cancel()
			return nil, nil, err
		}
	}
	return sub, cancel, nil
}

// route is channel's hub: one for a client or cluster, one per channel of
// a ring.
func (dep *deployment) route(channel string) string {
	if dep.ring {
		return channel
	}
	return ""
}

// pubSub opens a hub's connection; a ring's subscribes to its channel at
// once, which routes it to the channel's shard.
func (dep *deployment) pubSub(ctx context.Context, route string) *redis.PubSub {
	if route != "" {
		return dep.rdb.Subscribe(ctx, route)
	}
	return dep.rdb.Subscribe(ctx)
}

// mayBeActive says, without building a channel's name, whether a channel
// may be confirmed on a live connection: false when no hub has one, as on
// a Driver that nobody waited on in a while.
func (dep *deployment) mayBeActive() bool {
	dep.mu.Lock()
	defer dep.mu.Unlock()
	for _, h := range dep.hubs {
		if !h.dead && len(h.chans) > 0 {
			return true
		}
	}
	return false
}

// subscribeActive is subscribe without a round trip, when key's channel is
// already confirmed on a live connection; nil otherwise.
func (dep *deployment) subscribeActive(key, id string, ch chan struct{}) (*subscription, func()) {
	channel := keysFor(key).channel
	dep.mu.Lock()
	defer dep.mu.Unlock()
	h := dep.hubs[dep.route(channel)]
	if dep.closed || h == nil || h.dead || h.chans[channel] == nil || !h.chans[channel].active {
		return nil, nil
	}
	sub := &subscription{ch: ch, id: id}
	st := h.add(channel, sub)
	return sub, sync.OnceFunc(func() { dep.unsubscribe(h, channel, st, sub) })
}

// add puts sub on channel, ending its linger; dep.mu is held.
func (h *hub) add(channel string, sub *subscription) *chanState {
	st := h.chans[channel]
	if st == nil {
		st = &chanState{subs: map[*subscription]struct{}{}}
		h.chans[channel] = st
	}
	if st.idle != nil && st.idle.Stop() {
		h.dep.wg.Done()
	}
	st.idle = nil
	st.subs[sub] = struct{}{}
	return st
}

// barrierTimeout bounds a confirmation: past it, the caller polls.
const barrierTimeout = 2 * time.Second

// confirm sends SUBSCRIBE, then a PING with a unique payload, on one
// connection: the server answers in order, so the PONG proves the
// subscription. On a connection replaced meanwhile, go-redis subscribed
// again before sending anything else, so a later PONG proves it too.
func (h *hub) confirm(ctx context.Context, channel string, st *chanState) error {
	wait, cancel := context.WithTimeoutCause(ctx, barrierTimeout, errors.New("no confirmation from the server"))
	defer cancel()
	// Wait for the connection ctx-aware: a write to a dead server blocks.
	select {
	case h.wmu <- struct{}{}:
	case <-wait.Done():
		if ctx.Err() == nil {
			return errors.New("redislock: subscribe: the pub/sub connection is busy")
		}
		return fmt.Errorf("redislock: subscribe: %w", context.Cause(ctx))
	}
	epoch, err := h.barrier(ctx, wait, func() error {
		defer h.dep.in.CutOnEnd(ctx).Stop() // dialing the connection reads the server's greeting
		return h.ps.Subscribe(ctx, channel)
	})
	h.dep.mu.Lock()
	if err == nil && h.epoch == epoch && !h.dead {
		st.active = true
	}
	h.dep.mu.Unlock()
	if err != nil {
		return fmt.Errorf("redislock: subscribe: %w", err)
	}
	return nil
}

const pingPrefix = "redislock:"

// barrier writes what write sends (if not nil), then a PING whose PONG it
// waits for until wait ends, and gives back h.wmu, which the caller holds
// (h.ps changes only under it: replace), once written. It returns the
// connection's epoch at the PING; ErrClosed when h is dead.
func (h *hub) barrier(ctx, wait context.Context, write func() error) (epoch uint64, err error) {
	dep := h.dep
	dep.mu.Lock()
	if h.dead {
		dep.mu.Unlock()
		<-h.wmu
		return 0, backend.ErrClosed
	}
	dep.seq++
	seq, epoch, done := dep.seq, h.epoch, make(chan error, 1)
	h.barriers[seq] = done
	dep.mu.Unlock()
	if write != nil {
		err = write()
	}
	if err == nil {
		err = h.ps.Ping(ctx, pingPrefix+strconv.FormatUint(seq, 10))
	}
	<-h.wmu
	if err == nil {
		select {
		case err = <-done:
		case <-wait.Done():
			err = context.Cause(wait)
		}
	}
	dep.mu.Lock()
	delete(h.barriers, seq)
	dep.mu.Unlock()
	return epoch, err
}

// unsubscribe removes sub, and UNSUBSCRIBEs an idle channel after linger.
func (dep *deployment) unsubscribe(h *hub, channel string, st *chanState, sub *subscription) {
	dep.mu.Lock()
	defer dep.mu.Unlock()
	delete(st.subs, sub)
	if len(st.subs) > 0 || dep.closed || h.dead || h.chans[channel] != st || st.idle != nil {
		return
	}
	dep.wg.Add(1)
	st.idleGen++
	gen := st.idleGen
	st.idle = time.AfterFunc(dep.linger, func() {
		defer dep.wg.Done()
		h.expire(channel, st, gen)
	})
}

// expire UNSUBSCRIBEs an idle channel, or closes the hub if it was the last.
func (h *hub) expire(channel string, st *chanState, gen uint64) {
	dep := h.dep
	if !h.lockWrites() {
		return
	}
	defer func() { <-h.wmu }()
	dep.mu.Lock()
	if dep.closed || h.dead || h.chans[channel] != st || len(st.subs) > 0 || st.idle == nil || st.idleGen != gen {
		dep.mu.Unlock()
		return
	}
	delete(h.chans, channel)
	last := len(h.chans) == 0
	if last {
		h.kill()
		if dep.hubs[h.route] == h {
			delete(dep.hubs, h.route)
		}
	}
	dep.mu.Unlock()
	if last {
		_ = h.ps.Close()
		h.endBarriers(math.MaxUint64, backend.ErrClosed)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = h.ps.Unsubscribe(ctx, channel)
}

// kill marks the hub dead; dep.mu must be held.
func (h *hub) kill() {
	if !h.dead {
		h.dead = true
		close(h.quit)
	}
}

// endBarriers hands err to the barriers up to seq (all: math.MaxUint64).
func (h *hub) endBarriers(seq uint64, err error) {
	h.dep.mu.Lock()
	defer h.dep.mu.Unlock()
	for s, done := range h.barriers {
		if s <= seq {
			done <- err // its only value: it leaves the map with it
			delete(h.barriers, s)
		}
	}
}

// run reads the hub's connection, delivering messages and PONGs, until it
// is closed.
func (h *hub) run() {
	dep := h.dep
	ctx := context.Background()
	failures := 0
	// Reconnections after the first are paced (go-redis reconnects on Receive).
	backoff := retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		dep.mu.Lock()
		ps := h.ps
		dep.mu.Unlock()
		msg, err := ps.Receive(ctx)
		if err != nil {
			dep.mu.Lock()
			dead, replaced := h.dead, h.ps != ps
			dep.mu.Unlock()
			if replaced && !dead {
				continue // by check, which did what follows
			}
			if dead || errors.Is(err, redis.ErrClosed) {
				return
			}
			// The connection failed; go-redis reconnects and subscribes
			// again, but what was published meanwhile is lost: subscribers
			// get a value once their channel is subscribed again (below),
			// and subscriptions must be confirmed anew.
			dep.mu.Lock()
			h.failed()
			dep.mu.Unlock()
			h.endBarriers(math.MaxUint64, fmt.Errorf("pub/sub connection: %w", err))
			failures++
			if failures > 1 {
				t := time.NewTimer(backoff.Next())
				select {
				case <-t.C:
				case <-h.quit:
					t.Stop()
					return
				}
			}
			continue
		}
		failures = 0
		backoff.Reset()
		switch m := msg.(type) {
		case *redis.Subscription:
			// Subscribed again after a failure: what was published
			// meanwhile went unheard, and what comes after is ours.
			dep.mu.Lock()
			if st := h.chans[m.Channel]; m.Kind == "subscribe" && st != nil && st.stale {
				st.stale = false
				for s := range st.subs {
					backend.Notify(s.ch)
				}
			}
			dep.mu.Unlock()
		case *redis.Message:
			to, ho, handed := parseHandoff(m.Payload)
			dep.mu.Lock()
			// All are told: the Client's turnstile orders its own waiters.
			if st := h.chans[m.Channel]; st != nil {
				for s := range st.subs {
					mine := handed && s.id == to
					if mine {
						s.addHanded(ho)
					}
					if mine || s.id == "" || !handed && (m.Payload == "" || s.id == m.Payload) {
						backend.Notify(s.ch)
					}
				}
			}
			dep.mu.Unlock()
		case *redis.Pong:
			// PONGs come in order: earlier barriers are passed too.
			digits, ours := strings.CutPrefix(m.Payload, pingPrefix)
			if seq, err := strconv.ParseUint(digits, 10, 64); ours && err == nil {
				h.endBarriers(seq, nil)
			}
		}
	}
}

// failed records that the hub's connection failed (or was given up):
// subscriptions must be confirmed anew, and subscribers are owed a value;
// dep.mu is held.
func (h *hub) failed() {
	h.epoch++
	for _, st := range h.chans {
		st.active = false
		st.stale = true
	}
}

// healthEvery is how often a hub checks that its connection answers: one
// gone silent without breaking (a partition, a half-open connection)
// would swallow releases, and go-redis never times out a pub/sub read.
const healthEvery = time.Second

// pongWait bounds the answer to a health check.
const pongWait = 2 * time.Second

var errNoPong = errors.New("pub/sub connection: no answer to a health check")

// check sends a PING on the hub's connection every healthEvery until the
// hub dies, and replaces the connection if no PONG comes within pongWait,
// or if one comes while a channel is still unconfirmed after a failure
// (its SUBSCRIBE was lost). A connection that fails outright is left to
// run and go-redis, which reconnect.
func (h *hub) check() {
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-h.quit:
			return
		}
		if !h.lockWrites() {
			return
		}
		ctx, cancel := context.WithTimeoutCause(context.Background(), pongWait, errNoPong)
		epoch, err := h.barrier(ctx, ctx, nil)
		cancel()
		h.dep.mu.Lock()
		same := h.epoch == epoch && !h.dead
		stale := false
		for _, st := range h.chans {
			stale = stale || st.stale
		}
		h.dep.mu.Unlock()
		switch {
		case !same:
		case errors.Is(err, errNoPong):
			h.replace(err)
		case err == nil && stale:
			h.replace(errors.New("pub/sub connection: a subscription was lost"))
		}
	}
}

// lockWrites takes h.wmu (give it back with <-h.wmu) unless the hub quits.
func (h *hub) lockWrites() bool {
	select {
	case h.wmu <- struct{}{}:
		return true
	case <-h.quit:
		return false
	}
}

// replace swaps the hub's connection for a new one, subscribed again.
func (h *hub) replace(reason error) {
	dep := h.dep
	if !h.lockWrites() {
		return
	}
	defer func() { <-h.wmu }()
	ctx, cancel := context.WithTimeout(context.Background(), pongWait)
	defer cancel()
	ps := dep.pubSub(ctx, h.route)
	dep.mu.Lock()
	if h.dead {
		dep.mu.Unlock()
		_ = ps.Close()
		return
	}
	old := h.ps
	h.ps = ps
	channels := slices.Collect(maps.Keys(h.chans))
	h.failed() // before run can read a confirmation on ps
	dep.mu.Unlock()
	_ = old.Close()
	h.endBarriers(math.MaxUint64, reason)
	if !dep.ring && len(channels) > 0 {
		// On failure go-redis subscribes them again when it reconnects.
		_ = ps.Subscribe(ctx, channels...)
	}
}
