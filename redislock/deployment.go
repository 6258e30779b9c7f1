package redislock

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

var (
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/refresh.lua
	refreshLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/raise.lua
	raiseLua string
	//go:embed scripts/queue.lua
	queueLua string
	//go:embed scripts/fair_acquire.lua
	fairAcquireLua string
	//go:embed scripts/leave.lua
	leaveLua string

	// Script.Run sends EVALSHA and falls back to EVAL when the server
	// answers NOSCRIPT (a restart or failover emptied its script cache).
	acquireScript = redis.NewScript("local restart_delay = tonumber(ARGV[4])\n" + acquireLua)
	refreshScript = redis.NewScript(refreshLua)
	releaseScript = redis.NewScript("local function next_waiter() return '' end\n" + releaseLua)
	raiseScript   = redis.NewScript(raiseLua)

	// Fair mode's scripts share queue.lua; fair acquire runs the plain
	// acquire script as a function, for the head of the queue only.
	fairAcquireScript = redis.NewScript(queueLua + "local restart_delay = tonumber(ARGV[7])\nlocal function acquire()\n" + acquireLua + "\nend\n" + fairAcquireLua)
	fairReleaseScript = redis.NewScript(queueLua + "local function next_waiter() return live_head(KEYS[2], KEYS[3], '') end\n" + releaseLua)
	leaveScript       = redis.NewScript(queueLua + leaveLua)
)

// Key layout. The lock key and its fence counter share the hash tag
// {EscapeKey(key)}, so they live in one Redis Cluster slot and one script
// can touch both. EscapeKey's output has no braces, so the tag is exactly
// the escaped key.
func lockKey(key string) string  { return "{" + backend.EscapeKey(key) + "}:lock" }
func fenceKey(key string) string { return "{" + backend.EscapeKey(key) + "}:fence" }

// releaseChannel is where a release is published. Channels ignore the
// database number, so two applications that share a server but not a
// database may wake each other's waiters: a spurious wake-up costs one
// attempt, nothing more.
func releaseChannel(key string) string { return "{" + backend.EscapeKey(key) + "}:released" }

// Fair mode's queue: waiters in order of arrival, and until when each is
// alive (see scripts/queue.lua).
func queueKey(key string) string { return "{" + backend.EscapeKey(key) + "}:queue" }
func liveKey(key string) string  { return "{" + backend.EscapeKey(key) + "}:live" }

// ttlMillis rounds ttl up to whole milliseconds, PX's unit, at least 1.
func ttlMillis(ttl time.Duration) int64 {
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	return max(int64(ms), 1)
}

// deployment is one Redis deployment reached through one go-redis client:
// a server, a Redis Cluster or a ring, which answers for every key on its
// own. It runs the scripts, the maxmemory check and the release
// subscriptions. A Driver uses one deployment; a Quorum uses several, one
// per independent member, and decides by majority.
//
// Not "node": Redis Cluster calls each of its servers a node, and one
// deployment may be a whole cluster of them. Not "server", for the same
// reason, nor "store": the backend package calls a store what a driver's
// grants are judged against (fences increase over "every earlier grant by
// any client of the store"), which for a Quorum is all its members
// together. "Deployment" is Redis's own word for a standalone server, a
// Sentinel-managed set or a cluster, and what the Driver's and Open's
// documentation already said.
type deployment struct {
	rdb    redis.UniversalClient
	addr   string // for messages
	owned  bool   // opened by us: Close closes it
	ring   bool   // *redis.Ring: subscriptions must be routed per channel
	log    *slog.Logger
	linger time.Duration
	// restartMax caps restartDelay; < 0: no cap.
	restartMax time.Duration
	// publishDenied warns once of a refused wake-up (see released).
	publishDenied sync.Once
	in            *interrupter // cuts calls on a dead connection short; nil for a caller's client

	ctx    context.Context // ended by close: interrupts background cleanups
	cancel context.CancelFunc

	checkCancel context.CancelFunc
	closeOnce   sync.Once

	mu     sync.Mutex
	closed bool
	hubs   map[string]*hub // by route: "" for a client or cluster, the channel for a ring
	seq    uint64          // last barrier PING payload sent, on any hub
	wg     sync.WaitGroup  // hub goroutines, linger timers, the maxmemory check
}

func newDeployment(rdb redis.UniversalClient, owned bool, cfg *config) *deployment {
	_, ring := rdb.(*redis.Ring)
	ctx, cancel := context.WithCancel(context.Background())
	return &deployment{
		rdb:        rdb,
		owned:      owned,
		ring:       ring,
		log:        cfg.logger,
		linger:     cfg.linger,
		restartMax: cfg.restartDelay,
		ctx:        ctx,
		cancel:     cancel,
		hubs:       map[string]*hub{},
	}
}

// The lock key holds "<token>.<attempt>". The token says who holds it, for
// refresh and release; the attempt says which try of that token set it, so
// that cleaning up after a failed try (in the background, on a server that
// answered late) never removes the key that a later, successful try of the
// same token set. Attempts are numbered in increasing order, and a key set
// by a later attempt is never overwritten by an earlier one (the acquire
// script checks), so a straggler of an abandoned try cannot take the key
// from the try that followed it.
var attempts atomic.Uint64

// attempt returns a lock value for a new try of l.
func attempt(l backend.Claim) string {
	return l.Token + "." + strconv.FormatUint(attempts.Add(1), 10)
}

func holder(l backend.Claim) string { return l.Token + "." }

// acquire runs the acquire script for one attempt (see attempt): the
// fence; 0 when another token holds the lock; -n when the server started
// less than a TTL ago and grants the name only in n milliseconds.
func (dep *deployment) acquire(ctx context.Context, l backend.Claim, value string, px int64) (int64, error) {
	defer dep.in.watch(ctx).stop()
	v, err := acquireScript.Run(ctx, dep.rdb, []string{lockKey(l.Key), fenceKey(l.Key)}, value, px, holder(l), dep.restartDelay(px)).Int64()
	return v, classify(err)
}

// classify marks the server's refusal of our identity or of a command
// (an ACL without the permission; NOPERM, WRONGPASS, NOAUTH) as
// backend.ErrPermission: a configuration error that waiting cannot fix. A
// command the ACL refuses inside a script is an ERR, with a message that
// differs by version (7.0: "The user executing the script can't ...",
// 7.2 and later: "ACL failure in script: ...").
func classify(err error) error {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return err
	}
	for _, code := range aclRefusals {
		if strings.Contains(re.Error(), code) {
			return fmt.Errorf("%w: %w", backend.ErrPermission, err)
		}
	}
	return err
}

var aclRefusals = []string{"NOPERM", "WRONGPASS", "NOAUTH", "The user executing the script can't", "ACL failure in script"}

// released reads the release script's answer, and warns once when the
// server refused the wake-up (see release.lua).
func (dep *deployment) released(v int64) bool {
	if v == 2 {
		dep.publishDenied.Do(func() {
			dep.log.Warn("redislock: the server refuses PUBLISH on the release channels ({name}:released): waiters poll instead of being woken; grant the ACL user &* or the channel pattern")
		})
	}
	return v >= 1
}

// restartDelay is how long after its start a server refuses names it has
// no fence counter for, in milliseconds, for a lock of px milliseconds.
func (dep *deployment) restartDelay(px int64) int64 {
	if dep.restartMax < 0 {
		return px
	}
	return min(px, dep.restartMax.Milliseconds())
}

// notAcquired is the error of an acquisition the server refused: r is the
// script's answer, 0 or -n (see acquire).
func notAcquired(op string, r int64) error {
	if r < 0 {
		return fmt.Errorf("redislock: %s: %w", op, &backend.NotAcquiredError{Reason: fmt.Sprintf(
			"the server started less than a TTL ago and may have forgotten a holder; it grants this name in %v", time.Duration(-r)*time.Millisecond)})
	}
	return fmt.Errorf("redislock: %s: %w", op, backend.ErrNotAcquired)
}

func (dep *deployment) refresh(ctx context.Context, l backend.Claim, px int64) (bool, error) {
	defer dep.in.watch(ctx).stop()
	v, err := refreshScript.Run(ctx, dep.rdb, []string{lockKey(l.Key)}, holder(l), px).Int64()
	return v == 1, classify(err)
}

func (dep *deployment) release(ctx context.Context, l backend.Claim) (bool, error) {
	defer dep.in.watch(ctx).stop()
	v, err := releaseScript.Run(ctx, dep.rdb, []string{lockKey(l.Key)}, holder(l), releaseChannel(l.Key), "0").Int64()
	return dep.released(v), classify(err)
}

// fairAcquire runs the fair acquire script for waiter w (wait: join the
// queue when not granted): the fence, 0 when not granted, or -n when w is
// next and the lock is held for n more milliseconds.
func (dep *deployment) fairAcquire(ctx context.Context, l backend.Claim, value string, px int64, w string, wait bool) (int64, error) {
	defer dep.in.watch(ctx).stop()
	mode := "try"
	if wait {
		mode = "wait"
	}
	keys := []string{lockKey(l.Key), fenceKey(l.Key), queueKey(l.Key), liveKey(l.Key)}
	v, err := fairAcquireScript.Run(ctx, dep.rdb, keys, value, px, holder(l), w, livenessTTL.Milliseconds(), mode, dep.restartDelay(px)).Int64()
	return v, classify(err)
}

// fairRelease is release that names the next waiter in its message.
func (dep *deployment) fairRelease(ctx context.Context, l backend.Claim) (bool, error) {
	defer dep.in.watch(ctx).stop()
	keys := []string{lockKey(l.Key), queueKey(l.Key), liveKey(l.Key)}
	v, err := fairReleaseScript.Run(ctx, dep.rdb, keys, holder(l), releaseChannel(l.Key), "0").Int64()
	return dep.released(v), classify(err)
}

// leave takes waiter w out of l.Key's queue, even when ctx is done, and
// cleans up after its attempt value. Best effort: a waiter that could not
// leave is dropped once its liveness runs out.
func (dep *deployment) leave(ctx context.Context, l backend.Claim, value, w string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.watch(ctx).stop()
	keys := []string{lockKey(l.Key), queueKey(l.Key), liveKey(l.Key)}
	_ = leaveScript.Eval(ctx, dep.rdb, keys, value, releaseChannel(l.Key), w).Err()
}

func (dep *deployment) raise(ctx context.Context, l backend.Claim, value string, fence uint64) (bool, error) {
	defer dep.in.watch(ctx).stop()
	v, err := raiseScript.Run(ctx, dep.rdb, []string{lockKey(l.Key), fenceKey(l.Key)}, value, strconv.FormatUint(fence, 10)).Int64()
	return v == 1, classify(err)
}

// cleanup removes what a failed attempt may have left: the script may have
// run even though its reply was lost or ctx ended. Best effort, bounded,
// and only if that very attempt holds the key.
//
// Clean-ups (cleanup, leave) send the whole script (EVAL), not its hash:
// they run when a connection is in trouble, often one whose answers are
// lost, and a NOSCRIPT answer (a server that never ran the script, or
// restarted) would never arrive to trigger the fallback, so the clean-up
// would not run at all.
func (dep *deployment) cleanup(ctx context.Context, l backend.Claim, value string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	defer dep.in.watch(ctx).stop()
	_ = releaseScript.Eval(ctx, dep.rdb, []string{lockKey(l.Key)}, value, releaseChannel(l.Key), "1").Err()
}

const cleanupTimeout = 2 * time.Second

// cleanupWait is how long a call whose context ended waits for its cleanup
// (see undo): a server that answers does so within a round trip, one that
// does not is not waited for.
const cleanupWait = 50 * time.Millisecond

// undo runs f, the cleanup after a failed call (cleanup, leave), for the
// caller until f returns or ctx ends, and then cleanupWait more: a caller
// who gave up gets its answer within that, as backend.Driver requires. What
// f has not done by then goes on in the background, until f returns (it
// bounds itself by cleanupTimeout); close interrupts it and waits for it
// (on a caller's client, which cannot be interrupted, up to its
// ReadTimeout or cleanupTimeout).
func (dep *deployment) undo(ctx context.Context, f func(context.Context)) {
	dep.mu.Lock()
	if dep.closed {
		dep.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWait)
		defer cancel()
		f(ctx)
		return
	}
	dep.wg.Add(1)
	dep.mu.Unlock()
	done := make(chan struct{})
	bg := context.WithoutCancel(ctx)
	go func() {
		defer dep.wg.Done()
		defer close(done)
		// f ignores cancellation, but close cuts a read it is stuck on.
		defer dep.in.watch(dep.ctx).stop()
		f(bg)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// checkMaxmemory warns once when a server may evict keys: an evicted lock
// key is a silently lost lock. A server that refuses CONFIG (managed
// services often do) is not an error.
func (dep *deployment) checkMaxmemory(ctx context.Context, what string) {
	check := func(ctx context.Context, c redis.Cmdable) error {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			dep.log.Debug("redislock: cannot read maxmemory-policy", "server", what, "err", err)
			return nil
		}
		if p, ok := m["maxmemory-policy"]; ok && p != "noeviction" {
			dep.log.Warn("redislock: maxmemory-policy is not noeviction: an evicted lock key is a silently lost lock; set maxmemory-policy noeviction",
				"server", what, "maxmemory-policy", p)
		}
		return nil
	}
	switch c := dep.rdb.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return check(ctx, c) })
	case *redis.Ring:
		_ = c.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return check(ctx, c) })
	default:
		_ = check(ctx, dep.rdb)
	}
}

// checkMaxmemoryAsync runs the check in the background, for constructors
// that have no context; close stops it.
func (dep *deployment) checkMaxmemoryAsync(what string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	dep.checkCancel = cancel
	dep.wg.Add(1)
	go func() {
		defer dep.wg.Done()
		defer cancel()
		dep.checkMaxmemory(ctx, what)
	}()
}

// close stops the deployment's goroutines and subscriptions, and closes
// the client if this package dialed it (owned).
func (dep *deployment) close() error {
	dep.mu.Lock()
	if dep.closed {
		dep.mu.Unlock()
		return nil
	}
	dep.closed = true
	var hubs []*hub
	for _, h := range dep.hubs {
		hubs = append(hubs, h)
		h.kill()
		for _, st := range h.chans {
			if st.idle != nil && st.idle.Stop() {
				dep.wg.Done()
			}
			st.idle = nil
		}
	}
	dep.hubs = map[string]*hub{}
	dep.mu.Unlock()
	dep.cancel()
	if dep.checkCancel != nil {
		dep.checkCancel()
	}
	for _, h := range hubs {
		_ = h.ps.Close()
		h.failBarriers(backend.ErrClosed)
	}
	dep.wg.Wait()
	return dep.closeClient()
}

// closeClient closes the client if this package dialed it (owned), once.
func (dep *deployment) closeClient() error {
	var err error
	if dep.owned {
		dep.closeOnce.Do(func() { err = dep.rdb.Close() })
	}
	return err
}

// ---------------------------------------------------------------- notifications

// A hub is one pub/sub connection and the goroutine that reads it. A plain
// client or a cluster shares one hub among all channels (PUBLISH reaches
// every node of a cluster, so any node will do); a ring routes each channel
// to its shard, so it gets a hub per channel. A channel stays subscribed for
// a moment (linger) after its last waiter leaves, so that a busy lock costs
// no SUBSCRIBE round trip per acquisition; a hub without channels closes.
type hub struct {
	dep   *deployment
	route string
	ps    *redis.PubSub
	wmu   chan struct{} // held (full) while writing SUBSCRIBE, UNSUBSCRIBE or PING, to order them

	// Guarded by n.mu.
	chans    map[string]*chanState
	dead     bool
	quit     chan struct{}       // closed when dead is set
	epoch    uint64              // advanced whenever the connection failed
	barriers map[uint64]*barrier // PING payload -> waiting Subscribe
}

type chanState struct {
	subs    map[*subscription]struct{}
	active  bool        // confirmed subscribed on the current connection
	idle    *time.Timer // linger before UNSUBSCRIBE, when subs is empty
	idleGen uint64      // which linger idle is
}

type subscription struct {
	ch  chan struct{}
	seq uint64 // order of arrival: the longest waiter has the smallest
	id  string // a fair waiter's name: woken only by messages naming it or none
}

type barrier struct {
	done chan error // buffered 1
}

// subscribe arranges for ch to receive a value whenever key's release
// channel carries a message, and returns once the subscription is confirmed.
func (dep *deployment) subscribe(ctx context.Context, key string, ch chan struct{}) (cancel func(), err error) {
	return dep.subscribeAs(ctx, key, "", ch)
}

// subscribeAs is subscribe for fair waiter id ("": any waiter): ch then
// receives only the messages that name id, or no one.
func (dep *deployment) subscribeAs(ctx context.Context, key, id string, ch chan struct{}) (cancel func(), err error) {
	channel := releaseChannel(key)
	route := ""
	if dep.ring {
		route = channel
	}
	sub := &subscription{ch: ch, seq: subSeq.Add(1), id: id}
	var h *hub
	var st *chanState
	for h == nil {
		dep.mu.Lock()
		if dep.closed {
			dep.mu.Unlock()
			return nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
		}
		if cur := dep.hubs[route]; cur != nil && !cur.dead {
			h = cur
			break
		}
		dep.mu.Unlock()
		// Make the connection object outside the lock: for a ring it
		// already subscribes.
		var ps *redis.PubSub
		if dep.ring {
			ps = dep.rdb.Subscribe(ctx, channel)
		} else {
			ps = dep.rdb.Subscribe(ctx)
		}
		dep.mu.Lock()
		if dep.closed {
			dep.mu.Unlock()
			_ = ps.Close()
			return nil, fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
		}
		if cur := dep.hubs[route]; cur != nil && !cur.dead {
			dep.mu.Unlock()
			_ = ps.Close()
			continue
		}
		h = &hub{dep: dep, route: route, ps: ps, chans: map[string]*chanState{}, barriers: map[uint64]*barrier{}, quit: make(chan struct{}), wmu: make(chan struct{}, 1)}
		dep.hubs[route] = h
		dep.wg.Add(1)
		go h.run()
	}
	// n.mu is held.
	st = h.chans[channel]
	if st == nil {
		st = &chanState{subs: map[*subscription]struct{}{}}
		h.chans[channel] = st
	}
	if st.idle != nil {
		if st.idle.Stop() {
			dep.wg.Done()
		}
		st.idle = nil
	}
	st.subs[sub] = struct{}{}
	active := st.active
	dep.mu.Unlock()

	var once sync.Once
	cancel = func() { once.Do(func() { dep.unsubscribe(h, channel, st, sub) }) }
	if active {
		return cancel, nil
	}
	if err := h.confirm(ctx, channel, st); err != nil {
		cancel()
		return nil, err
	}
	return cancel, nil
}

// barrierTimeout bounds the wait for a subscription's confirmation: past
// it, the caller waits by polling rather than not at all.
const barrierTimeout = 2 * time.Second

// confirm sends SUBSCRIBE and then a PING with a unique payload on the same
// connection. The server answers in order, so the PONG proves the
// subscription active. If the connection was replaced meanwhile, go-redis
// subscribed the channel again on the new one before sending anything else,
// so a later PONG proves it as well.
func (h *hub) confirm(ctx context.Context, channel string, st *chanState) error {
	dep := h.dep
	b := &barrier{done: make(chan error, 1)}
	deadline := time.NewTimer(barrierTimeout)
	defer deadline.Stop()
	// Wait for the connection ctx-aware: a write to a server that does not
	// answer can take long.
	select {
	case h.wmu <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("redislock: subscribe: %w", context.Cause(ctx))
	case <-deadline.C:
		return errors.New("redislock: subscribe: the pub/sub connection is busy")
	}
	dep.mu.Lock()
	if h.dead {
		dep.mu.Unlock()
		<-h.wmu
		return fmt.Errorf("redislock: subscribe: %w", backend.ErrClosed)
	}
	dep.seq++
	seq := dep.seq
	epoch := h.epoch
	h.barriers[seq] = b
	dep.mu.Unlock()
	w := dep.in.watch(ctx) // dialing the connection reads the server's greeting
	err := h.ps.Subscribe(ctx, channel)
	w.stop()
	if err == nil {
		err = h.ps.Ping(ctx, pingPrefix+strconv.FormatUint(seq, 10))
	}
	<-h.wmu
	if err == nil {
		select {
		case err = <-b.done:
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-deadline.C:
			err = errors.New("no confirmation from the server")
		}
	}
	dep.mu.Lock()
	delete(h.barriers, seq)
	if err == nil && h.epoch == epoch && !h.dead {
		st.active = true
	}
	dep.mu.Unlock()
	if err != nil {
		return fmt.Errorf("redislock: subscribe: %w", err)
	}
	return nil
}

const pingPrefix = "redislock:"

// unsubscribe removes sub, and after the linger UNSUBSCRIBEs the channel
// if nobody subscribed again.
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
	select {
	case h.wmu <- struct{}{}:
	case <-h.quit:
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
		h.failBarriers(backend.ErrClosed)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = h.ps.Unsubscribe(ctx, channel)
}

// subSeq numbers subscriptions in order of arrival.
var subSeq atomic.Uint64

// wakeStagger is how much later than the one before it each waiter of a
// process is woken by a release, longest waiter first.
const wakeStagger = 300 * time.Microsecond

// deliver wakes the waiters of a released lock, the longest waiting at
// once and each of the others wakeStagger after the one before it. All
// are told, as the Notifier contract says; the head start lets the longest
// waiter of each process try first, so that waiters are served roughly in
// arrival order instead of racing on every release, in which some of them
// lose for a long time.
func (dep *deployment) deliver(subs []*subscription) {
	slices.SortFunc(subs, func(a, b *subscription) int { return cmp.Compare(a.seq, b.seq) })
	for i, s := range subs {
		if i == 0 || wakeStagger == 0 {
			notify(s.ch)
			continue
		}
		ch := s.ch
		time.AfterFunc(time.Duration(i)*wakeStagger, func() { notify(ch) })
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// kill marks the hub dead; n.mu must be held.
func (h *hub) kill() {
	if !h.dead {
		h.dead = true
		close(h.quit)
	}
}

func (h *hub) failBarriers(err error) {
	h.dep.mu.Lock()
	defer h.dep.mu.Unlock()
	for seq, b := range h.barriers {
		select {
		case b.done <- err:
		default:
		}
		delete(h.barriers, seq)
	}
}

// run reads the hub's connection until it is closed, delivering release
// messages and PONGs.
func (h *hub) run() {
	dep := h.dep
	defer dep.wg.Done()
	ctx := context.Background()
	failures := 0
	for {
		msg, err := h.ps.Receive(ctx)
		if err != nil {
			dep.mu.Lock()
			dead := h.dead
			dep.mu.Unlock()
			if dead || errors.Is(err, redis.ErrClosed) {
				return
			}
			// The connection failed; go-redis reconnects and subscribes
			// again, but messages sent meanwhile are lost (waiters' backoff
			// covers them), and subscriptions must be confirmed anew.
			dep.mu.Lock()
			h.epoch++
			for _, st := range h.chans {
				st.active = false
			}
			dep.mu.Unlock()
			h.failBarriers(fmt.Errorf("pub/sub connection: %w", err))
			failures++
			if failures > 1 {
				d := min(time.Duration(failures)*50*time.Millisecond, time.Second)
				t := time.NewTimer(d)
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
		switch m := msg.(type) {
		case *redis.Message:
			dep.mu.Lock()
			var subs []*subscription
			if st := h.chans[m.Channel]; st != nil {
				for s := range st.subs {
					if m.Payload == "" || s.id == "" || s.id == m.Payload {
						subs = append(subs, s)
					}
				}
			}
			dep.mu.Unlock()
			dep.deliver(subs)
		case *redis.Pong:
			if len(m.Payload) <= len(pingPrefix) || m.Payload[:len(pingPrefix)] != pingPrefix {
				continue
			}
			seq, err := strconv.ParseUint(m.Payload[len(pingPrefix):], 10, 64)
			if err != nil {
				continue
			}
			// PONGs arrive in order: every earlier barrier on this
			// connection is passed too.
			dep.mu.Lock()
			for s, b := range h.barriers {
				if s <= seq {
					select {
					case b.done <- nil:
					default:
					}
					delete(h.barriers, s)
				}
			}
			dep.mu.Unlock()
		}
	}
}
