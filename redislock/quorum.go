package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
)

// Quorum is the Redlock algorithm over N independent Redis servers (not
// replicas of each other): a lock is held when a majority of them granted
// it, within its validity. Every request goes to all servers at once and
// returns at the first majority. Validity and fences: see
// docs/backends/redislock.md, Quorum.
type Quorum struct {
	deps   []*deployment
	addrs  []string // for error messages
	quorum int
	cfg    config
	// gate ends and awaits the requests in flight and late answers.
	gate backend.Gate

	mu       sync.Mutex
	inflight map[string]*acquisition // by token
	hot      map[string]*hotKey      // contended names, by key (quorum_hot.go)
	hotPrune int                     // prune hot when it reaches this size

	work    chan func()     // to idle workers (quorum_workers.go)
	closing <-chan struct{} // the gate's: closed when Close begins
}

// acquisition follows a successful acquisition's servers that had not
// answered when it succeeded: a release sent to one of them can overtake
// the acquisition on another connection and leave its grant behind.
type acquisition struct {
	pending atomic.Int64  // servers yet to answer
	servers []straggler   // by server
	settled chan struct{} // closed when the last of them has been dealt with
}

// straggler is one server's answer, for a Release that comes before it.
type straggler struct {
	// state: 0 no answer yet; 1 answered (r is set); 2 a release found
	// nothing to release before the answer came: late releases the grant.
	state atomic.Int32
	r     result
}

func newQuorum(deps []*deployment, addrs []string, cfg config) *Quorum {
	q := &Quorum{deps: deps, addrs: addrs, quorum: len(deps)/2 + 1, cfg: cfg, inflight: map[string]*acquisition{}, hot: map[string]*hotKey{}, hotPrune: 64, work: make(chan func())}
	q.closing = q.gate.Context().Done()
	return q
}

var (
	_ backend.Driver         = (*Quorum)(nil)
	_ backend.Notifier       = (*Quorum)(nil)
	_ backend.BatchRefresher = (*Quorum)(nil)
	_ backend.Inspector      = (*Quorum)(nil)
	_ backend.Lister         = (*Quorum)(nil)
	_ backend.Breaker        = (*Quorum)(nil)
	_ backend.Diagnoser      = (*Quorum)(nil)
)

// NewQuorum returns a Quorum over clients, one per independent server
// (plain *redis.Client values, not replicas of one another; an odd number,
// usually 3 or 5). Close does not close them.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) (*Quorum, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("redislock: quorum: %w: no servers", backend.ErrUnsupported)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	var deps []*deployment
	var addrs []string
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redislock: NewQuorum: %w: client %d is nil", backend.ErrInvalidOption, i)
		}
		deps = append(deps, newDeployment(c, nil, &cfg))
		addr := fmt.Sprintf("server %d", i+1)
		if cl, ok := c.(*redis.Client); ok {
			addr = cl.Options().Addr
		}
		addrs = append(addrs, addr)
	}
	q := newQuorum(deps, addrs, cfg)
	for i, dep := range q.deps {
		dep.checkMaxmemoryAsync(q.addrs[i])
	}
	return q, nil
}

// Quorum returns how many servers must grant a lock: a majority.
func (q *Quorum) Quorum() int { return q.quorum }

// px is the expiry asked of each server: the TTL and the drift allowance.
func (q *Quorum) px(ttl time.Duration) int64 {
	stretched := time.Duration(float64(ttl)/(1-q.cfg.driftFactor)) + q.cfg.driftMin
	return ttlMillis(max(stretched, ttl))
}

type result struct {
	answered bool // the server answered before gather returned
	ok       bool
	fence    uint64
	settle   time.Duration // a refusal's: the server restarted, and grants the name after this
	err      error
	view     holding            // Inspect's and Break's: the server's holding, when ok
	found    map[string]holding // List's
}

// gather is fanOut that counts the answers, returned in server order,
// until decided says they settle the matter.
func (q *Quorum) gather(ctx context.Context, timeout time.Duration, linked bool,
	fn func(ctx context.Context, i int) result,
	decided func(ok, notOK int) bool,
	late func(i int, r result),
) []result {
	res := make([]result, len(q.deps))
	started := fanOut(q, ctx, timeout, linked, fn, func(i int, r result) bool {
		r.answered = true
		res[i] = r
		return decided(count(res))
	}, late)
	if !started {
		return closedResults(len(q.deps))
	}
	return res
}

// fanOut runs fn on every server concurrently, each with a context that
// timeout and Close end but the caller's cancellation does not (a command
// sent should complete, so that the store is as the caller believes),
// unless linked (an acquisition's: a request not yet sent when the caller
// gives up could only grant a lock nobody wants). It hands the answers to
// take until take reports them decisive, all servers answered, or ctx
// ends; later answers go to late, in the background (Close waits for
// them). It returns false, with nothing run, once Close has begun.
func fanOut[T any](q *Quorum, ctx context.Context, timeout time.Duration, linked bool,
	fn func(ctx context.Context, i int) T,
	take func(i int, v T) bool,
	late func(i int, v T),
) bool {
	closing, done, ok := q.gate.Background()
	if !ok {
		return false
	}
	reqCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	stopOnClose := context.AfterFunc(closing, cancel)
	unlink := func() bool { return false }
	if linked {
		unlink = context.AfterFunc(ctx, cancel)
	}
	// end gives back the ticket once the last request is done.
	end := func() { unlink(); stopOnClose(); cancel(); done() }
	type answer struct {
		i int
		v T
	}
	ch := make(chan answer, len(q.deps))
	var wg sync.WaitGroup
	for i := range q.deps {
		wg.Add(1)
		q.run(func() {
			defer wg.Done()
			ch <- answer{i, fn(reqCtx, i)}
		})
	}
	got, settled := 0, false
	for got < len(q.deps) && !settled {
		select {
		case a := <-ch:
			got++
			settled = take(a.i, a.v)
		case <-ctx.Done():
			settled = true
		}
	}
	if got == len(q.deps) {
		end()
		return true
	}
	go func() {
		defer end()
		wg.Wait()
		close(ch)
		for a := range ch {
			if late != nil {
				late(a.i, a.v)
			}
		}
	}()
	return true
}

// closedResults are the answers of n requests not sent: Close has begun.
func closedResults(n int) []result {
	res := make([]result, n)
	for i := range res {
		res[i] = result{answered: true, err: backend.ErrClosed}
	}
	return res
}

// decidedBy: a majority said yes, or so many said no that none can.
func (q *Quorum) decidedBy(ok, notOK int) bool {
	return ok >= q.quorum || notOK > len(q.deps)-q.quorum
}

// ServerError is one quorum server's failure: an error, or ErrNoAnswer. A
// quorum's error that names servers wraps one per server, for errors.As.
// It does not unwrap to Err: one server's error (a refused permission) is
// not the quorum's verdict.
type ServerError struct {
	Addr string
	Err  error
}

func (e *ServerError) Error() string {
	if strings.Contains(e.Err.Error(), e.Addr) {
		return e.Err.Error() // a dial error names the server already
	}
	return e.Addr + ": " + e.Err.Error()
}

// ErrNoAnswer is a quorum server's silence when the others decided.
var ErrNoAnswer = errors.New("no answer in time")

// serverErrors are the servers' failures in one request.
type serverErrors []error

func (es serverErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (es serverErrors) Unwrap() []error { return es }

// errSummary is the servers' errors and silences.
func (q *Quorum) errSummary(res []result) error {
	var es serverErrors
	for i, r := range res {
		switch {
		case !r.answered:
			es = append(es, &ServerError{q.addrs[i], ErrNoAnswer})
		case r.err != nil:
			es = append(es, &ServerError{q.addrs[i], r.err})
		}
	}
	return es
}

func count(res []result) (ok, notOK int) {
	for _, r := range res {
		switch {
		case !r.answered, r.err != nil:
		case r.ok:
			ok++
		default:
			notOK++
		}
	}
	return ok, notOK
}

// restarted counts the servers refusing since they restarted, and the
// longest they still refuse.
func restarted(res []result) (n int, settle time.Duration) {
	for _, r := range res {
		if r.answered && r.err == nil && r.settle > 0 {
			n, settle = n+1, max(settle, r.settle)
		}
	}
	return n, settle
}

// TryAcquire implements backend.Driver: the lock is held when a majority
// of the servers granted it within its validity. Any failure releases it
// everywhere (a server that grants after the attempt was given up releases
// at once). Servers that have not answered when a majority has are not
// waited for.
//
// Contenders that try at once can split the vote so that none has a
// majority: such an attempt is released and tried again after a short
// random pause, at most splitRetries times, so that one of them wins, as
// with a single server.
func (q *Quorum) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if q.gate.Closed() {
		return backend.Grant{}, fmt.Errorf("redislock: quorum: try-acquire: %w", backend.ErrClosed)
	}
	if l.Mode != backend.Exclusive {
		return backend.Grant{}, fmt.Errorf("redislock: quorum: try-acquire: %w: %s mode (see Modes)", backend.ErrUnsupported, l.Mode)
	}
	if l.TTL < minQuorumTTL {
		l.TTL = minQuorumTTL
	}
	// Random pauses of 1-2ms, then up to 4 and 8: contenders spread out.
	backoff := retry.Backoff{Min: 2 * time.Millisecond, Max: 8 * time.Millisecond}
	for attempt := 1; ; attempt++ {
		hot, wait := q.hotState(l.Key, time.Now())
		if wait > 0 && retry.Sleep(ctx, wait) != nil {
			return backend.Grant{}, fmt.Errorf("redislock: quorum: try-acquire: %w", context.Cause(ctx))
		}
		g, split, err := q.tryOnce(ctx, l, hot)
		if !split || attempt > splitRetries || ctx.Err() != nil {
			return g, err
		}
		if !backoff.Pause(ctx) {
			return g, err
		}
	}
}

const splitRetries = 3

// minQuorumTTL is the shortest TTL a Quorum grants: a shorter one could be
// used up by acquiring's two rounds of requests on a busy machine.
const minQuorumTTL = 500 * time.Millisecond

// tryOnce is one attempt; on a hot name it asks the arbiter first.
func (q *Quorum) tryOnce(ctx context.Context, l backend.Claim, hot bool) (_ backend.Grant, split bool, _ error) {
	px := q.px(l.TTL)
	ttl := time.Duration(ttlMillis(l.TTL)) * time.Millisecond
	value := attempt(l)
	keys := lockKeys(l.Key)
	t0 := time.Now()
	arbiter, pre := -1, (*result)(nil)
	if hot {
		var refused bool
		arbiter = q.arbiter(l.Key)
		if pre, refused = q.tryArbiter(ctx, l, keys, value, px); refused {
			q.noteDenied(l.Key, time.Now())
			return backend.Grant{}, false, fmt.Errorf("redislock: quorum: try-acquire: %w (refused by %s, the name's first server)", backend.ErrNotAcquired, q.addrs[arbiter])
		}
	}
	// outcome is closed when this attempt is settled; failed tells how.
	outcome := make(chan struct{})
	var failed atomic.Bool
	// A server that grants after the attempt was given up, or after its
	// lock was released (the request can reach the server after the
	// release's, on another connection), releases it at once.
	st := &acquisition{servers: make([]straggler, len(q.deps)), settled: make(chan struct{})}
	late := func(i int, r result) {
		<-outcome
		mayHold := r.ok || r.err != nil
		// After a success, a release that found nothing before this
		// answer (see straggler) came first: release the grant.
		if mayHold && (failed.Load() || st.servers[i].state.Load() == 2) {
			q.deps[i].cleanup(ctx, l, value)
		}
		if st.pending.Add(-1) == 0 {
			q.mu.Lock()
			if q.inflight[l.Token] == st {
				delete(q.inflight, l.Token)
			}
			q.mu.Unlock()
			close(st.settled)
		}
	}
	// A server that has not answered within the validity is of no use.
	// Linked: a request not yet sent when the caller gives up is not sent;
	// late sees one already sent through.
	res := q.gather(ctx, ttl, true, func(nctx context.Context, i int) result {
		var r result
		if i == arbiter && pre != nil {
			r = *pre // granted already
		} else {
			f, err := q.acquireOn(nctx, i, l, keys, value, px)
			r = result{ok: f > 0, fence: uint64(max(f, 0)), settle: time.Duration(-min(f, 0)) * time.Millisecond, err: err}
		}
		s := &st.servers[i]
		s.r = r
		s.state.CompareAndSwap(0, 1)
		return r
	}, q.decidedBy, late)
	granted, denied := count(res)
	// The fence is the highest granted; confirmed, the servers at it.
	var fence uint64
	unanswered, confirmed := int64(0), 0
	for _, r := range res {
		switch {
		case !r.answered:
			unanswered++
		case r.ok && r.err == nil && r.fence > fence:
			fence, confirmed = r.fence, 1
		case r.ok && r.err == nil && r.fence == fence:
			confirmed++
		}
	}
	st.pending.Store(unanswered)
	if unanswered == 0 {
		close(st.settled)
	}
	fail := func(split bool, err error) (backend.Grant, bool, error) {
		undone := q.abandon(ctx, l, value, res)
		failed.Store(true)
		close(outcome)
		if ctx.Err() != nil {
			// The caller gave up: what its requests granted is undone
			// before it hears so, within CancelGrace (the rest in the
			// background).
			wait := time.NewTimer(backend.CancelGrace)
			defer wait.Stop()
			for _, ch := range []<-chan struct{}{undone, st.settled} {
				select {
				case <-ch:
				case <-wait.C:
					return backend.Grant{}, false, err
				}
			}
		}
		return backend.Grant{}, split, err
	}
	if granted < q.quorum {
		if granted+denied >= q.quorum {
			// Decided: another token holds it, or the vote split.
			q.noteDenied(l.Key, time.Now())
			why := error(backend.ErrNotAcquired)
			if n, settle := restarted(res); n > 0 {
				why = &backend.NotAcquiredError{Reason: fmt.Sprintf("%d of the servers started less than a TTL ago and may have forgotten a holder; they grant this name in %v at most", n, settle)}
			}
			return fail(granted > 0, fmt.Errorf("redislock: quorum: try-acquire: %w (%d of %d servers granted, %d needed)",
				why, granted, len(q.deps), q.quorum))
		}
		if ctx.Err() != nil {
			return fail(false, fmt.Errorf("redislock: quorum: try-acquire: %w (%d of %d servers had answered)",
				context.Cause(ctx), granted+denied, len(q.deps)))
		}
		return fail(false, fmt.Errorf("redislock: quorum: try-acquire: only %d of %d servers answered, %d needed: %w",
			granted+denied, len(q.deps), q.quorum, q.errSummary(res)))
	}

	// Raise the granting servers' counters below the fence (see
	// docs/backends/redislock.md, Quorum, Fencing).
	lostRace := false
	var raiseErr error
	var wg sync.WaitGroup
	var mu sync.Mutex
	if confirmed < granted { // some granting servers are below the fence
		rctx, cancel := context.WithDeadline(ctx, t0.Add(ttl))
		defer cancel()
		for i, r := range res {
			if !r.answered || !r.ok || r.err != nil || r.fence == fence {
				continue
			}
			wg.Go(func() {
				left := px - time.Since(t0).Milliseconds() - 1
				ok, err := q.deps[i].raise(rctx, l, value, fence, left)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					if raiseErr == nil {
						raiseErr = &ServerError{q.addrs[i], err}
					}
				case ok:
					confirmed++
				default:
					lostRace = true
				}
			})
		}
		wg.Wait()
	}
	elapsed := time.Since(t0)
	switch {
	case confirmed < q.quorum && lostRace:
		return fail(false, fmt.Errorf("redislock: quorum: try-acquire: %w: the lock expired on a server during the acquisition", backend.ErrNotAcquired))
	case confirmed < q.quorum && elapsed >= ttl:
		return fail(false, fmt.Errorf("redislock: quorum: try-acquire: %w: acquiring took %v, its whole validity (%v)", backend.ErrNotAcquired, elapsed.Round(time.Millisecond), raiseErr))
	case confirmed < q.quorum:
		return fail(false, fmt.Errorf("redislock: quorum: try-acquire: raising the fence failed on too many servers (%d of %d needed confirmed): %w", confirmed, q.quorum, raiseErr))
	case elapsed >= ttl:
		return fail(false, fmt.Errorf("redislock: quorum: try-acquire: %w: acquiring took %v, its whole validity", backend.ErrNotAcquired, elapsed.Round(time.Millisecond)))
	}
	if unanswered > 0 {
		q.mu.Lock()
		q.inflight[l.Token] = st
		q.mu.Unlock()
	}
	close(outcome)
	q.noteGranted(l.Key)
	return backend.Grant{Fence: fence, TTL: ttl}, false, nil
}

// abandon releases a failed acquisition: at once where it was granted, in
// the background where the request failed (it may have been granted;
// undone is closed when those are done); late answers release themselves.
func (q *Quorum) abandon(ctx context.Context, l backend.Claim, value string, res []result) (undone <-chan struct{}) {
	var wg, bg sync.WaitGroup
	for i, r := range res {
		switch {
		case r.answered && r.ok && r.err == nil:
			wg.Go(func() { q.deps[i].cleanup(ctx, l, value) })
		case r.answered && r.err != nil:
			closing, done, ok := q.gate.Background()
			if !ok {
				q.deps[i].cleanup(ctx, l, value) // closing: no background left
				continue
			}
			bg.Go(func() {
				defer done()
				// The cleanup ignores ctx; Close cuts its reads.
				defer q.deps[i].in.CutOnEnd(closing).Stop()
				q.deps[i].cleanup(ctx, l, value)
			})
		}
	}
	wg.Wait()
	ch := make(chan struct{})
	go func() { bg.Wait(); close(ch) }()
	return ch
}

// Refresh implements backend.Driver: RefreshMany's batch of one.
func (q *Quorum) Refresh(ctx context.Context, l backend.Claim) error {
	return q.RefreshMany(ctx, []backend.Claim{l})[0]
}

// verdict decides a refresh or a release (op) from the servers' answers;
// a refresh (ttl > 0, sent at t0) must be confirmed within its TTL.
func (q *Quorum) verdict(ctx context.Context, op string, res []result, t0 time.Time, ttl time.Duration) error {
	ok, notHeld := count(res)
	late := ttl > 0 && time.Since(t0) >= ttl
	switch {
	case ok >= q.quorum && !late:
		return nil
	case notHeld > len(q.deps)-q.quorum:
		return fmt.Errorf("redislock: quorum: %s: %w (%d of %d servers held it, %d needed)", op, backend.ErrNotHeld, ok, len(q.deps), q.quorum)
	case ok >= q.quorum:
		return fmt.Errorf("redislock: quorum: %s: took %v, longer than the TTL", op, time.Since(t0).Round(time.Millisecond))
	case ctx.Err() != nil:
		return fmt.Errorf("redislock: quorum: %s: %w", op, context.Cause(ctx))
	default:
		return fmt.Errorf("redislock: quorum: %s: %d of %d servers confirmed, %d needed: %w", op, ok, len(q.deps), q.quorum, q.errSummary(res))
	}
}

// Release implements backend.Driver: it releases the lock on every server
// (slow ones in the background), and reports ErrNotHeld when no majority
// held it for the token.
func (q *Quorum) Release(ctx context.Context, l backend.Claim) error {
	if q.gate.Closed() {
		return fmt.Errorf("redislock: quorum: release: %w", backend.ErrClosed)
	}
	// A server whose answer to the acquisition is still on its way is
	// released at once too; if it had nothing to release, the answer's
	// grant is released when it comes (see straggler).
	q.mu.Lock()
	st := q.inflight[l.Token]
	q.mu.Unlock()
	// A majority's answers free the lock; the arbiter's is awaited for up
	// to arbiterGrace more, since an attempt on a hot name asks the arbiter
	// alone first (quorum_hot.go): otherwise a TryAcquire right after this
	// Release could still be refused.
	arb := q.arbiter(l.Key)
	var arbiterAnswered atomic.Bool
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var grace *time.Timer // its stop after the return is a no-op
	decided := func(ok, notOK int) bool {
		switch {
		case notOK > len(q.deps)-q.quorum:
			return true
		case ok < q.quorum:
			return false
		case arbiterAnswered.Load():
			return true
		case grace == nil:
			grace = time.AfterFunc(arbiterGrace, stop)
		}
		return false
	}
	res := q.gather(wctx, min(max(l.TTL, time.Second), 10*time.Second), false, func(ctx context.Context, i int) result {
		dep := q.deps[i]
		if i == arb {
			defer arbiterAnswered.Store(true)
		}
		var s *straggler
		if st != nil {
			s = &st.servers[i]
			if s.state.Load() == 1 && s.r.err == nil && !s.r.ok {
				return result{} // it refused: nothing of ours there
			}
		}
		ok, err := dep.release(ctx, l)
		if s != nil && !ok && !s.state.CompareAndSwap(0, 2) && s.state.Load() == 1 && (s.r.ok || s.r.err != nil) {
			// Nothing released, but the answer came meanwhile: it may
			// have landed after the release.
			ok, err = dep.release(ctx, l)
		}
		return result{ok: ok, err: err}
	}, decided, nil)
	q.noteReleased(l.Key, time.Now())
	return q.verdict(ctx, "release", res, time.Time{}, 0)
}

// Subscribe implements backend.Notifier: it subscribes on every server and
// returns once a majority confirmed. A release reaches a majority too, so
// at least one subscribed server sees it.
func (q *Quorum) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if q.gate.Closed() {
		return nil, nil, fmt.Errorf("redislock: quorum: subscribe: %w", backend.ErrClosed)
	}
	ch := make(chan struct{}, 1)
	// Every server's subscription ends with subs, even one confirmed later.
	subs, cancel := context.WithCancel(context.Background())
	// Linked: the caller's ctx ends the wait for a confirmation.
	res := q.gather(ctx, barrierTimeout, true, func(sctx context.Context, i int) result {
		_, c, err := q.deps[i].subscribe(sctx, key, "", ch)
		if err == nil {
			context.AfterFunc(subs, c)
		}
		return result{ok: err == nil, err: err}
	}, func(ok, _ int) bool { return ok >= q.quorum }, nil)
	if ok, _ := count(res); ok < q.quorum {
		cancel()
		return nil, nil, fmt.Errorf("redislock: quorum: subscribe: %d of %d servers confirmed, %d needed: %w", ok, len(q.deps), q.quorum, q.errSummary(res))
	}
	return ch, cancel, nil
}

// Close implements backend.Driver. It closes the clients only if OpenQuorum
// or locker.Open created them, and waits for the requests in flight: on
// clients it closes they end at once, on a caller's at their read timeout.
func (q *Quorum) Close() error {
	// Close the clients we opened as soon as the gate shuts, so that the
	// requests the gate waits for end at once.
	closed := make(chan []error, 1)
	context.AfterFunc(q.gate.Context(), func() {
		var errs []error
		for _, dep := range q.deps {
			errs = append(errs, dep.closeClient())
		}
		closed <- errs
	})
	if !q.gate.Close() {
		return fmt.Errorf("redislock: quorum: close: %w", backend.ErrClosed)
	}
	errs := <-closed
	for _, dep := range q.deps {
		errs = append(errs, dep.close()) // Join drops the nils
	}
	return errors.Join(errs...)
}

// quorumPrefix declares the acquire script's settings, from ARGV[4..7]:
// acquire.lua's, and the clock floor's grain (see fence.lua).
const quorumPrefix = "local restart_delay, retention, owner = tonumber(ARGV[4]), ARGV[5], ARGV[6]\nfence_grain = tonumber(ARGV[7])\n"

// quorumAcquireScript is the plain quorum acquire script.
var quorumAcquireScript = newScript(lua("fence") + quorumPrefix + lua("acquire"))

// grain rounds the clock floor, in µs: a second, or half the retention.
func (dep *deployment) grain() int64 {
	return max(min(1_000_000, dep.retention*1000/2), 1)
}

// acquireOn is acquire on server i; keys are lockKeys', built once.
func (q *Quorum) acquireOn(ctx context.Context, i int, l backend.Claim, keys []string, value string, px int64) (int64, error) {
	dep := q.deps[i]
	delay := dep.restartDelay(px)
	defer dep.in.CutOnEnd(ctx).Stop()
	return dep.up.run(ctx, dep, q.gate.Background, quorumAcquireScript, quorumPrefix, delay, keys, value, px, holderOf(l, value), delay, dep.retentionArg, l.Owner, dep.grain())
}

// lockKeys are the acquire script's keys for key.
func lockKeys(key string) []string {
	k := keysFor(key)
	return []string{k.lock, k.fence}
}
