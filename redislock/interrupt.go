package redislock

// Interruptible connections.
//
// go-redis reads a reply until the socket's read deadline, which it sets
// from ReadTimeout (and from the context's deadline when
// ContextTimeoutEnabled is set), but it never watches a context's
// cancellation: a call blocked on a dead connection outlives a cancelled
// context by ReadTimeout, or more with its retries (10 s seen). The backend
// contract wants the call back within a round trip, and the locker Client
// calls a driver's first try directly on the caller's goroutine, so the
// driver must make its own calls interruptible.
//
// For the clients redislock dials itself (Open, OpenFair, OpenQuorum),
// every connection is tracked (internal/conntrack), which counts its
// Reads (two atomic adds per Read, no allocation). Each driver call whose context can end
// registers a context.AfterFunc (see watch); when the context ends while
// the call runs, the reads then in progress on the client's connections are
// noted, and if the call is still running interruptGrace later, those of
// them still blocked get a read deadline of now: go-redis sees a timeout,
// drops the connection, and its retry loop sleeps on the (ended) context
// before any retry, so the call returns. The call cannot be told from its
// connection (go-redis does not say which one a command uses), hence the
// rule: only a read that began before the cancel and stayed blocked past
// the grace, while the cancelled call is still stuck, is cut; on a server
// that answers within the grace that is never a healthy read. The
// trade-off: a read of another call that takes longer than interruptGrace
// for other reasons (a server slower than that, a blocking command such as
// BLPOP on Driver.Client) and is in progress when a stuck call's context
// ends fails with a timeout; the driver's own commands are short scripts,
// and the locker Client retries a failed try or refresh. Reads without a
// deadline (pub/sub, which waits for messages indefinitely) are never cut.
//
// A client passed to New, NewFair or NewQuorum was not dialed by us: its
// calls end at the client's ReadTimeout, or at the context's deadline if it
// sets ContextTimeoutEnabled, not at a cancellation.

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/internal/conntrack"
)

// interruptGrace is how long a read blocked at a context's cancellation may
// go on before it is cut. A reply to one of the driver's scripts takes well
// under a millisecond on a LAN and a few across a data centre, so a read
// still blocked 50 ms after the cancel is almost surely on a dead
// connection; and 50 ms, plus cleanupWait, keeps a cancelled Acquire within
// the contract's 100 ms (plus one round trip).
const interruptGrace = 50 * time.Millisecond

// interrupter knows the live connections of one go-redis client.
type interrupter struct {
	conns *conntrack.Tracker
	cut   atomic.Int64 // reads interrupted, for tests
}

func newInterrupter() *interrupter {
	return &interrupter{conns: conntrack.New()}
}

// interruptible makes the connections of a client built from o
// interruptible by the returned interrupter, and has go-redis honour
// context deadlines itself.
func interruptible(o *redis.Options) *interrupter {
	in := newInterrupter()
	o.ContextTimeoutEnabled = true
	dial := o.Dialer
	if dial == nil {
		dial = redis.NewDialer(o) // reads o's DialTimeout and TLSConfig when it dials
	}
	o.Dialer = in.dialer(dial)
	return in
}

// interruptibleCluster is interruptible for a cluster client: one
// interrupter for the connections to all its nodes.
func interruptibleCluster(o *redis.ClusterOptions) *interrupter {
	in := newInterrupter()
	o.ContextTimeoutEnabled = true
	dial := o.Dialer
	if dial == nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})(ctx, network, addr)
		}
	}
	o.Dialer = in.dialer(dial)
	return in
}

// dialer tracks the connections dial makes. The tracked connection keeps
// go-redis's health check, which peeks at the socket of a connection that
// is a syscall.Conn (and only then).
func (in *interrupter) dialer(dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return in.conns.Add(c)
	}
}

// A watch is one driver call's: while the call runs after its context
// ended, reads blocked for interruptGrace are cut.
type watch struct {
	in     *interrupter
	stopAF func() bool
	done   atomic.Bool
}

// watch arranges for the end of ctx to interrupt the reads that block a
// call made with it; the caller calls stop when the call returns. A nil
// interrupter (a client we did not dial) does nothing.
func (in *interrupter) watch(ctx context.Context) *watch {
	if in == nil || ctx.Done() == nil {
		return nil
	}
	w := &watch{in: in}
	w.stopAF = context.AfterFunc(ctx, w.fire)
	return w
}

// stop ends the watch: the call returned.
func (w *watch) stop() {
	if w != nil {
		w.done.Store(true)
		w.stopAF()
	}
}

// maxRounds bounds fire: a call that is still running after this many
// rounds of cuts (a second) is left to go-redis's own timeouts.
const maxRounds = 20

// fire runs when the call's context ends: it notes the reads in progress
// and, if the call is still running interruptGrace later, cuts those still
// blocked (a read without a deadline, pub/sub's, never). It goes on in
// rounds while the call runs: the call may not have been reading yet when
// its context ended (dialing, writing), or go-redis may retry on a new
// connection (it sleeps on the ended context before a retry, which returns
// at once unless the retry backoff is zero).
func (w *watch) fire() {
	for range maxRounds {
		blocked := w.in.conns.Reading()
		time.Sleep(interruptGrace)
		if w.done.Load() {
			return
		}
		for _, r := range blocked {
			if r.Interrupt() {
				w.in.cut.Add(1)
			}
		}
	}
}
