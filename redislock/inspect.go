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

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Lister    = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
	_ backend.Inspector = (*Quorum)(nil)
	_ backend.Lister    = (*Quorum)(nil)
	_ backend.Breaker   = (*Quorum)(nil)
)

// lockKnows is what a lock value records (see parseValue); a fair queue
// adds its waiters, each named with its owner.
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
// its PTTL in milliseconds. ok is false for a key that is gone or has no
// expiry, or a value this package did not write.
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

// inspect runs the inspect script for key: the holder, if any, and in fair
// mode the owners of the live waiters, next first.
func (dep *deployment) inspect(ctx context.Context, key string, fair bool) (h holding, held bool, queue []string, err error) {
	defer dep.in.watch(ctx).stop()
	k := keysFor(key)
	ks := []string{k.lock}
	if fair {
		ks = append(ks, k.queue, k.live)
	}
	r, err := inspectScript.Run(ctx, dep.rdb, ks).Slice()
	if err != nil {
		return holding{}, false, nil, classify(err)
	}
	if len(r) < 2 {
		return holding{}, false, nil, fmt.Errorf("inspect script: unexpected answer %v", r)
	}
	v, _ := r[0].(string)
	pttl, _ := r[1].(int64)
	h, held = parseValue(v, pttl)
	for _, w := range r[2:] {
		s, _ := w.(string)
		_, owner, _ := strings.Cut(s, ":") // the waiter's ID, then its owner
		queue = append(queue, owner)
	}
	return h, held, queue, nil
}

// breakLock runs the break script: the removed holder, or held false.
func (dep *deployment) breakLock(ctx context.Context, key string, fence uint64, fair bool) (h holding, held bool, err error) {
	defer dep.in.watch(ctx).stop()
	k := keysFor(key)
	script, ks := breakScript, []string{k.lock}
	if fair {
		script, ks = fairBreakScript, []string{k.lock, k.queue, k.live}
	}
	r, err := script.Run(ctx, dep.rdb, ks, strconv.FormatUint(fence, 10), k.channel).Slice()
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

// list finds every lock key of the deployment whose key starts with
// prefix, with SCAN on every master (never KEYS, which blocks the server),
// and reads each one's value and PTTL. The key comes back from the escaped
// name (backend.EscapeKey is reversible).
func (dep *deployment) list(ctx context.Context, prefix string) (map[string]holding, error) {
	defer dep.in.watch(ctx).stop()
	// EscapeKey escapes a key of only dots whole; with a letter after it,
	// prefix escapes as it does at the start of every longer key. (No key
	// is "." or "..": the locker package's keys contain a '/'.)
	esc := backend.EscapeKey(prefix + "a")
	// EscapeKey's output has none of the glob's special characters.
	pattern := "{" + esc[:len(esc)-1] + "*}:lock"
	var mu sync.Mutex
	found := map[string]holding{}
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			names, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return err
			}
			if err := dep.readLocks(ctx, names, prefix, &mu, found); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := dep.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Ring:
		err = c.ForEachShard(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		return nil, fmt.Errorf("%w: cannot enumerate the servers of a %T", backend.ErrUnsupported, c)
	}
	if err != nil {
		return nil, classify(err)
	}
	return found, nil
}

// readLocks reads the value and PTTL of the lock keys names, in one
// pipeline (the client routes each key to its node), and adds the held
// ones under prefix to found.
func (dep *deployment) readLocks(ctx context.Context, names []string, prefix string, mu *sync.Mutex, found map[string]holding) error {
	type read struct {
		key  string
		val  *redis.StringCmd
		pttl *redis.DurationCmd
	}
	var reads []read
	p := dep.rdb.Pipeline()
	for _, name := range names {
		key, ok := lockKeyOf(name)
		if !ok || !strings.HasPrefix(key, prefix) {
			continue
		}
		reads = append(reads, read{key, p.Get(ctx, name), p.PTTL(ctx, name)})
	}
	if len(reads) == 0 {
		return nil
	}
	_, _ = p.Exec(ctx) // each command's error is read below
	for _, r := range reads {
		// redis.Nil: the lock went between SCAN and GET.
		for _, err := range []error{r.val.Err(), r.pttl.Err()} {
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range reads {
		if h, ok := parseValue(r.val.Val(), r.pttl.Val().Milliseconds()); ok {
			found[r.key] = h
		}
	}
	return nil
}

// lockKeyOf returns the lock key whose lock is name ("{E}:lock"), or
// false for a name this package did not make.
func lockKeyOf(name string) (string, bool) {
	esc, ok1 := strings.CutPrefix(name, "{")
	esc, ok2 := strings.CutSuffix(esc, "}:lock")
	if !ok1 || !ok2 || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	key, err := url.PathUnescape(esc)
	if err != nil || backend.EscapeKey(key) != esc {
		return "", false
	}
	return key, true
}

// Inspect implements backend.Inspector: the holder's owner, fence and
// time left, from the lock's value and PTTL, and the live waiters queued
// and their owners.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	// Both modes queue waiters, in the same keys.
	h, held, queue, err := d.dep.inspect(ctx, key, true)
	if err != nil {
		return backend.State{}, fmt.Errorf("redislock: %w", err)
	}
	st := backend.State{Key: key, Known: fairKnows}
	if held {
		st = h.state(key, fairKnows)
	}
	st.Waiters, st.Queue = len(queue), queue
	return st, nil
}

// List implements backend.Lister. It reports owner, fence and TTL; a
// FairDriver's waiters only Inspect counts.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	found, err := d.dep.list(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	out := make([]backend.State, 0, len(found))
	for key, h := range found {
		out = append(out, h.state(key, lockKnows))
	}
	slices.SortFunc(out, func(a, b backend.State) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// Break implements backend.Breaker: one script deletes the lock if its
// value records fence, and publishes the release, naming the next waiter.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	// The next waiter is woken by name, and tries (a default-mode waiter
	// too: its try takes the free lock).
	h, held, err := d.dep.breakLock(ctx, key, fence, true)
	if err != nil {
		return backend.State{}, fmt.Errorf("redislock: %w", err)
	}
	if !held {
		return backend.State{}, fmt.Errorf("redislock: %w", backend.ErrNotHeld)
	}
	return h.state(key, lockKnows), nil
}

// inspectTimeout bounds a Quorum's operator calls on each server.
const inspectTimeout = 10 * time.Second

// each runs fn on every server of q concurrently and returns the
// servers' answers, with res[i].answered false for one that did not answer
// in time. linked: the caller's ctx cancels the requests (not for Break,
// whose request sent should complete, as Release's does).
func (q *Quorum) each(ctx context.Context, linked bool, fn func(ctx context.Context, i int) result) []result {
	return q.gather(ctx, inspectTimeout, linked, fn, func(int, int) bool { return false }, nil)
}

// majority judges the servers' views of one key: the holding that a
// majority of the n servers share (the same attempt, with the same fence:
// the acquisition's, which the servers that decided it record, raised to
// it if need be; a server that granted after the decision keeps its own),
// with the time left on the quorum-th longest. uncertain: no majority, but
// the servers that did not answer could make one.
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

// views are the holdings the servers reported (ok), and how many servers
// did not answer.
func views(res []result) (vs []holding, missing int) {
	for _, r := range res {
		switch {
		case !r.answered || r.err != nil:
			missing++
		case r.ok:
			vs = append(vs, r.view)
		}
	}
	return vs, missing
}

// Inspect implements backend.Inspector: the lock is held when a majority
// of the servers hold it for the same acquisition. It fails when the
// servers that did not answer could make or unmake that majority.
func (q *Quorum) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	if q.gate.Closed() {
		return backend.State{}, fmt.Errorf("redislock: quorum: inspect: %w", backend.ErrClosed)
	}
	res := q.each(ctx, true, func(ctx context.Context, i int) result {
		h, held, _, err := q.deps[i].inspect(ctx, key, false)
		return result{ok: held, view: h, err: err}
	})
	vs, missing := views(res)
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
// servers. It fails when the servers that did not answer could make a
// majority for a key that the others show on a minority.
func (q *Quorum) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
	if q.gate.Closed() {
		return nil, fmt.Errorf("redislock: quorum: list: %w", backend.ErrClosed)
	}
	res := q.each(ctx, true, func(ctx context.Context, i int) result {
		found, err := q.deps[i].list(ctx, prefix)
		return result{ok: err == nil, found: found, err: err}
	})
	_, missing := views(res)
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
	slices.SortFunc(out, func(a, b backend.State) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// Break implements backend.Breaker: the break script runs on every
// server, deleting the lock where its value records fence (and waking
// the waiters there). It succeeds when that removed it from a majority.
func (q *Quorum) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	if q.gate.Closed() {
		return backend.State{}, fmt.Errorf("redislock: quorum: break: %w", backend.ErrClosed)
	}
	res := q.each(ctx, false, func(ctx context.Context, i int) result {
		h, held, err := q.deps[i].breakLock(ctx, key, fence, false)
		return result{ok: held, view: h, err: err}
	})
	removed, missing := views(res)
	h, held, uncertain := q.majority(removed, missing)
	switch {
	case held:
		return h.state(key, lockKnows), nil
	case uncertain:
		return backend.State{}, fmt.Errorf("redislock: quorum: break: removed from %d of %d servers, %d needed: %s", len(removed), len(q.deps), q.quorum, q.errSummary(res))
	}
	return backend.State{}, fmt.Errorf("redislock: quorum: break: %w (removed from %d of %d servers)", backend.ErrNotHeld, len(removed), len(q.deps))
}
