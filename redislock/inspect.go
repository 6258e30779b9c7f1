package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// lockKnows is what a lock value records; a queue adds its waiters.
const (
	lockKnows = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL
	fairKnows = lockKnows | backend.KnowsWaiters | backend.KnowsQueue
)

// holding is one server's view of a lock: its value, parsed, and PTTL.
type holding struct {
	attempt string // "<token>.<attempt>": never shown, only compared
	fence   uint64
	owner   string
	ttl     time.Duration
}

// parseValue reads a lock value, "<token>.<attempt>:<fence>:<owner>", and
// its PTTL in ms; not ok for a key gone or without expiry, or not ours.
func parseValue(v string, pttl int64) (h holding, ok bool) {
	attempt, rest, ok1 := strings.Cut(v, ":")
	fence, owner, ok2 := strings.Cut(rest, ":")
	f, err := strconv.ParseUint(fence, 10, 64)
	if !ok1 || !ok2 || err != nil || pttl <= 0 {
		return holding{}, false
	}
	return holding{attempt: attempt, fence: f, owner: owner, ttl: time.Duration(pttl) * time.Millisecond}, true
}

func (h holding) state(key string, known backend.Fields) backend.State {
	return backend.State{Key: key, Held: true, Owner: h.owner, Fence: h.fence, TTL: h.ttl, Known: known}
}

// inspect runs the inspect script: the holder, and the waiters' owners.
func (dep *deployment) inspect(ctx context.Context, key string, fair bool) (h holding, held bool, queue []string, err error) {
	k := keysFor(key)
	ks := []string{k.lock}
	if fair {
		ks = append(ks, k.queue, k.live)
	}
	r, err := dep.run(ctx, inspectScript, ks).Slice()
	if err != nil {
		return holding{}, false, nil, classify(err)
	}
	return inspected(r)
}

// inspected reads the inspect script's answer r.
func inspected(r []any) (h holding, held bool, queue []string, err error) {
	if len(r) < 2 {
		return holding{}, false, nil, fmt.Errorf("inspect script: unexpected answer %v", r)
	}
	v, _ := r[0].(string)
	pttl, _ := r[1].(int64)
	h, held = parseValue(v, pttl)
	return h, held, owners(r[2:]), nil
}

// owners reads the waiters' owners from the inspect scripts' answer (see
// scripts/waiters.lua): a waiter is a random ID (after its mode, for a
// semaphore's or a read-write lock's), ':', then its owner.
func owners(ws []any) []string {
	var out []string
	for _, w := range ws {
		s, _ := w.(string)
		_, owner, _ := strings.Cut(s, ":")
		out = append(out, owner)
	}
	return out
}

// breakLock runs the break script: the removed holder, or held false.
func (dep *deployment) breakLock(ctx context.Context, key string, fence uint64, fair bool) (h holding, held bool, err error) {
	k := keysFor(key)
	script, ks := breakScript, []string{k.lock}
	if fair {
		script, ks = fairBreakScript, []string{k.lock, k.queue, k.live}
	}
	r, err := dep.run(ctx, script, ks, strconv.FormatUint(fence, 10), k.channel).Slice()
	if errors.Is(err, redis.Nil) {
		return holding{}, false, nil
	}
	if err != nil {
		return holding{}, false, classify(err)
	}
	if len(r) != 3 {
		return holding{}, false, fmt.Errorf("break script: unexpected answer %v", r)
	}
	v, _ := r[0].(string)
	pttl, _ := r[1].(int64)
	sent, _ := r[2].(int64)
	dep.released(sent)
	h, _ = parseValue(v, max(pttl, 1))
	h.ttl = max(time.Duration(pttl)*time.Millisecond, 0)
	return h, true, nil
}

// scanCount is how many keys a SCAN page asks for.
const scanCount = 1000

// scan runs s, in one pipeline a page, on the keys (s's keys:
// keys(key)) that start with prefix and whose Redis name ends in kind
// (":lock", ":sem", ":rw"), found with SCAN (never KEYS, which blocks the
// server) on every server, concurrently, and hands take each answer, one
// at a time. The key comes back from the escaped name (backend.EscapeKey
// is reversible).
func (dep *deployment) scan(ctx context.Context, prefix, kind string, s *script, keys func(key string) []string, take func(key string, r []any) error) error {
	defer dep.in.CutOnEnd(ctx).Stop()
	// EscapeKey escapes a key of only dots whole; with a letter after it,
	// prefix escapes as at the start of every longer key ("." and ".." are
	// no keys: the locker package's keys contain a '/').
	esc := backend.EscapeKey(prefix + "a")
	// EscapeKey's output has none of the glob's special characters.
	pattern := "{" + esc[:len(esc)-1] + "*}" + kind
	var mu sync.Mutex
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			page, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return err
			}
			var found []string
			for _, name := range page {
				if key, ok := keyOf(name, kind); ok && strings.HasPrefix(key, prefix) {
					found = append(found, key)
				}
			}
			cmds := dep.pipelined(ctx, len(found), func(i int) (*script, []string, []any) {
				return s, keys(found[i]), nil
			})
			mu.Lock()
			for i := 0; i < len(cmds) && err == nil; i++ {
				var r []any
				if r, err = cmds[i].Slice(); err == nil {
					err = take(found[i], r)
				}
			}
			mu.Unlock()
			if cursor = next; cursor == 0 || err != nil {
				return err
			}
		}
	}
	return classify(dep.eachServer(ctx, scan))
}

// list reads the holder of every lock whose key starts with prefix.
func (dep *deployment) list(ctx context.Context, prefix string) (map[string]holding, error) {
	found := map[string]holding{}
	err := dep.scan(ctx, prefix, ":lock", inspectScript, func(key string) []string { return []string{keysFor(key).lock} }, func(key string, r []any) error {
		h, held, _, err := inspected(r)
		if held {
			found[key] = h
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return found, nil
}

// keyOf returns the key whose object of kind (":lock", ":sem", ":rw") is
// name ("{E}:lock"), or false for a name this package did not make.
func keyOf(name, kind string) (string, bool) {
	esc, ok1 := strings.CutPrefix(name, "{")
	esc, ok2 := strings.CutSuffix(esc, "}"+kind)
	if !ok1 || !ok2 || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	key, err := url.PathUnescape(esc)
	if err != nil || backend.EscapeKey(key) != esc {
		return "", false
	}
	return key, true
}

// Inspect implements backend.Inspector: a lock's holder (owner, fence, time
// left) and its queue's live waiters; a semaphore's or read-write lock's
// holders, limit and queue.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	ctx, done, err := d.enterObject(ctx, m)
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	var st backend.State
	if m = backend.Object(m); m != backend.Exclusive {
		st, err = d.dep.inspectShared(ctx, key, m)
	} else {
		// Both modes queue waiters, in the same keys.
		h, held, queue, e := d.dep.inspect(ctx, key, true)
		st, err = backend.State{Key: key, Known: fairKnows}, e
		if held {
			st = h.state(key, fairKnows)
		}
		st.Waiters, st.Queue = len(queue), queue
	}
	if err != nil {
		return backend.State{}, fmt.Errorf("redislock: %w", err)
	}
	return st, nil
}

// List implements backend.Lister: a lock's owner, fence and TTL (not its
// waiters: Inspect counts those); a semaphore or read-write lock as Inspect.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	ctx, done, err := d.enterObject(ctx, m)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []backend.State
	if m = backend.Object(m); m != backend.Exclusive {
		out, err = d.dep.listShared(ctx, prefix, m)
	} else {
		var found map[string]holding
		found, err = d.dep.list(ctx, prefix)
		for key, h := range found {
			out = append(out, h.state(key, lockKnows))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	return out, nil
}

// Break implements backend.Breaker: one script deletes the lock if its
// value records fence, or frees the grant of a semaphore or read-write
// lock under fence, and publishes the release as a holder's would.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	ctx, done, err := d.enterObject(ctx, m)
	if err != nil {
		return backend.State{}, err
	}
	defer done()
	var st backend.State
	held := false
	if m = backend.Object(m); m != backend.Exclusive {
		st, held, err = d.dep.breakShared(ctx, key, m, fence)
	} else {
		// The next waiter is woken by name and tries (in either mode).
		var h holding
		h, held, err = d.dep.breakLock(ctx, key, fence, true)
		st = h.state(key, lockKnows)
	}
	if err := heldErr(held, err); err != nil {
		return backend.State{}, err
	}
	return st, nil
}

// enterObject refuses a mode that is no object of a Driver's, then enters.
func (d *Driver) enterObject(ctx context.Context, m backend.Mode) (context.Context, func(), error) {
	if m > backend.Write {
		return nil, nil, fmt.Errorf("redislock: %w: %s mode", backend.ErrUnsupported, m)
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("redislock: %w", err)
	}
	return ctx, done, nil
}

// The operator's scripts of semaphores and read-write locks (shared.go).
var (
	sharedInspectScript = newScript(lua("shared", "waiters", "shared_inspect"))
	sharedBreakScript   = newScript(lua("shared", "shared_break"))
)

// inspectShared reads key's object m (Permit or Read).
func (dep *deployment) inspectShared(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	ks := fairSharedKeys(backend.Claim{Key: key, Mode: m})
	r, err := dep.run(ctx, sharedInspectScript, ks).Slice()
	if err != nil {
		return backend.State{}, classify(err)
	}
	return sharedState(key, m, r)
}

// listShared reads every held object of mode m whose key starts with prefix.
func (dep *deployment) listShared(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	var out []backend.State
	err := dep.scan(ctx, prefix, sharedKind(m), sharedInspectScript, func(key string) []string {
		return fairSharedKeys(backend.Claim{Key: key, Mode: m})
	}, func(key string, r []any) error {
		st, err := sharedState(key, m, r)
		if st.Held {
			out = append(out, st)
		}
		return err
	})
	return out, err
}

// sharedState reads the shared inspect script's answer r (shared_inspect.lua).
func sharedState(key string, m backend.Mode, r []any) (backend.State, error) {
	n := int64(-1)
	if len(r) >= 2 {
		n, _ = r[1].(int64)
	}
	if n < 0 || int64(len(r)) < 2+holderFields*n {
		return backend.State{}, fmt.Errorf("shared inspect script: unexpected answer %v", r)
	}
	st := backend.State{Key: key, Mode: m, Known: lockKnows.For(m) | backend.KnowsWaiters | backend.KnowsQueue}
	for i := range n {
		h, err := sharedHolder(m, r[2+holderFields*i:])
		if err != nil {
			return backend.State{}, err
		}
		st.Holders = append(st.Holders, h)
	}
	_, resized := r[0].(int64)
	if st.Held = len(st.Holders) > 0; st.Held || resized {
		// The resize record's limit, else the holders': none without them.
		st.Limit = limitOf(m, r[0])
	}
	st.Queue = owners(r[2+holderFields*n:])
	st.Waiters = len(st.Queue)
	return st, nil
}

// holderFields is how many values the shared scripts give of a grant.
const holderFields = 5

// sharedHolder reads a grant as the shared scripts give it: its fence
// (a string), ms left, permits, 1 for the writer, and its owner.
func sharedHolder(m backend.Mode, r []any) (backend.Holder, error) {
	fence, _ := r[0].(string)
	f, err := strconv.ParseUint(fence, 10, 64)
	if err != nil {
		return backend.Holder{}, fmt.Errorf("shared script: a holder's fence %v: %w", r[0], err)
	}
	ms, _ := r[1].(int64)
	w, _ := r[2].(int64)
	owner, _ := r[4].(string)
	h := backend.Holder{Mode: m, Owner: owner, Fence: f, TTL: time.Duration(ms) * time.Millisecond, Weight: int(w)}
	if wr, _ := r[3].(int64); wr == 1 {
		h.Mode = backend.Write
	}
	return h, nil
}

// limitOf reads a semaphore's limit from the scripts' answer (a resize
// record's is a number, the holders' a string); 0 for a read-write lock.
func limitOf(m backend.Mode, v any) int {
	if m != backend.Permit {
		return 0
	}
	switch v := v.(type) {
	case int64:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

// breakShared runs the shared break script: the removed grant, if held.
func (dep *deployment) breakShared(ctx context.Context, key string, m backend.Mode, fence uint64) (st backend.State, held bool, err error) {
	c := backend.Claim{Key: key, Mode: m}
	r, err := dep.run(ctx, sharedBreakScript, sharedKeys(c), strconv.FormatUint(fence, 10), keysFor(key).channel).Slice()
	if errors.Is(err, redis.Nil) {
		return backend.State{}, false, nil
	}
	if err != nil {
		return backend.State{}, false, classify(err)
	}
	if len(r) != 2+holderFields {
		return backend.State{}, false, fmt.Errorf("shared break script: unexpected answer %v", r)
	}
	h, err := sharedHolder(m, r[1:1+holderFields])
	if err != nil {
		return backend.State{}, false, err
	}
	sent, _ := r[1+holderFields].(int64)
	dep.released(sent)
	return backend.State{Key: key, Mode: m, Held: true, Limit: limitOf(m, r[0]), Holders: []backend.Holder{h}, Known: lockKnows.For(m)}, true, nil
}

// inspectTimeout bounds a Quorum's operator calls on each server.
const inspectTimeout = 10 * time.Second

// each refuses every object but the lock (a Quorum takes no other mode:
// see its Modes), then a closed Quorum, for op; then it runs fn on every
// server and returns their answers, the holdings they reported and how
// many did not answer in time. linked: the caller's ctx cancels the
// requests (not for Break, whose requests should complete).
func (q *Quorum) each(ctx context.Context, op string, m backend.Mode, linked bool, fn func(context.Context, *deployment) result) (res []result, views []holding, missing int, err error) {
	if m != backend.Exclusive {
		return nil, nil, 0, fmt.Errorf("redislock: quorum: %s: %w: a quorum has no %s objects (it takes only exclusive locks)", op, backend.ErrUnsupported, backend.Object(m))
	}
	if q.gate.Closed() {
		return nil, nil, 0, fmt.Errorf("redislock: quorum: %s: %w", op, backend.ErrClosed)
	}
	res = q.gather(ctx, inspectTimeout, linked, func(ctx context.Context, i int) result { return fn(ctx, q.deps[i]) }, func(int, int) bool { return false }, nil)
	for _, r := range res {
		switch {
		case !r.answered || r.err != nil:
			missing++
		case r.ok:
			views = append(views, r.view)
		}
	}
	return res, views, missing, nil
}

// majority judges the servers' views of one key: the holding that a
// majority share (the same attempt and fence: the acquisition's, which the
// deciding servers record, raised if need be; a server that granted after
// the decision keeps its own), with the time left on the quorum-th
// longest. uncertain: no majority, but the silent servers could make one.
func (q *Quorum) majority(views []holding, unanswered int) (h holding, held, uncertain bool) {
	type id struct {
		attempt string
		fence   uint64
	}
	groups := map[id][]holding{}
	best := 0
	for _, v := range views {
		k := id{v.attempt, v.fence}
		groups[k] = append(groups[k], v)
		best = max(best, len(groups[k]))
	}
	for _, g := range groups {
		if len(g) >= q.quorum {
			slices.SortFunc(g, func(a, b holding) int { return cmp.Compare(b.ttl, a.ttl) })
			return g[q.quorum-1], true, false
		}
	}
	return holding{}, false, best+unanswered >= q.quorum
}

// Inspect implements backend.Inspector: the lock is held when a majority
// of the servers hold it for the same acquisition. It fails when the
// silent servers could make or unmake that majority.
func (q *Quorum) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	res, vs, missing, err := q.each(ctx, "inspect", m, true, func(ctx context.Context, dep *deployment) result {
		h, held, _, err := dep.inspect(ctx, key, false)
		return result{ok: held, view: h, err: err}
	})
	if err != nil {
		return backend.State{}, err
	}
	h, held, uncertain := q.majority(vs, missing)
	switch {
	case held:
		return h.state(key, lockKnows), nil
	case uncertain:
		return backend.State{}, fmt.Errorf("redislock: quorum: inspect: %d of %d servers answered, too few to tell: %s", len(q.deps)-missing, len(q.deps), q.errSummary(res))
	}
	return backend.State{Key: key, Known: lockKnows}, nil
}

// List implements backend.Lister: the keys held on a majority of the
// servers. It fails when the silent servers could make a majority for a
// key that the others show on a minority.
func (q *Quorum) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	res, _, missing, err := q.each(ctx, "list", m, true, func(ctx context.Context, dep *deployment) result {
		found, err := dep.list(ctx, prefix)
		return result{ok: err == nil, found: found, err: err}
	})
	if err != nil {
		return nil, err
	}
	if len(q.deps)-missing < q.quorum {
		return nil, fmt.Errorf("redislock: quorum: list: %d of %d servers answered, %d needed: %s", len(q.deps)-missing, len(q.deps), q.quorum, q.errSummary(res))
	}
	byKey := map[string][]holding{}
	for _, r := range res {
		for key, h := range r.found {
			byKey[key] = append(byKey[key], h)
		}
	}
	var out []backend.State
	uncertain := 0
	for key, vs := range byKey {
		h, held, unsure := q.majority(vs, missing)
		switch {
		case held:
			out = append(out, h.state(key, lockKnows))
		case unsure:
			uncertain++
		}
	}
	if uncertain > 0 {
		return nil, fmt.Errorf("redislock: quorum: list: %d keys held on a minority of the servers that answered, which those that did not could make a majority: %s", uncertain, q.errSummary(res))
	}
	return out, nil
}

// Break implements backend.Breaker: the break script deletes the lock on
// every server where its value records fence (waking the waiters there);
// it succeeds when it removed it from a majority.
func (q *Quorum) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	res, removed, missing, err := q.each(ctx, "break", m, false, func(ctx context.Context, dep *deployment) result {
		h, held, err := dep.breakLock(ctx, key, fence, false)
		return result{ok: held, view: h, err: err}
	})
	if err != nil {
		return backend.State{}, err
	}
	h, held, uncertain := q.majority(removed, missing)
	switch {
	case held:
		return h.state(key, lockKnows), nil
	case uncertain:
		return backend.State{}, fmt.Errorf("redislock: quorum: break: removed from %d of %d servers, %d needed: %s", len(removed), len(q.deps), q.quorum, q.errSummary(res))
	}
	return backend.State{}, fmt.Errorf("redislock: quorum: break: %w (removed from %d of %d servers)", backend.ErrNotHeld, len(removed), len(q.deps))
}
