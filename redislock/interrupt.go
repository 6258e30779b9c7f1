package redislock

// Interruptible connections: go-redis never watches a context while it
// reads a reply, and the backend contract wants a cancelled call back
// within a round trip. So on the clients this package dials, a read still
// blocked interruptGrace after its call's context ended is cut. A caller's
// client is left alone. See docs/backends/redislock.md, Cancellation.

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/internal/conntrack"
)

// interruptGrace is how long a read blocked at a cancellation may go on
// before it is cut: a script's reply takes a few ms at most, so a read
// still blocked 50 ms later is almost surely on a dead connection; and 50
// ms plus cleanupWait keeps a cancelled Acquire within the contract's 100
// ms (plus one round trip).
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
	o.ContextTimeoutEnabled = true
	if o.Dialer == nil {
		o.Dialer = redis.NewDialer(o) // reads o's DialTimeout and TLSConfig when it dials
	}
	return track(&o.Dialer)
}

// interruptibleCluster is interruptible for all of a cluster's nodes.
func interruptibleCluster(o *redis.ClusterOptions) *interrupter {
	o.ContextTimeoutEnabled = true
	if o.Dialer == nil {
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})(ctx, network, addr)
		}
	}
	return track(&o.Dialer)
}

// track has the dialer *dial track the connections it makes. The tracked
// connection keeps go-redis's health check, which peeks at the socket of
// a connection that is a syscall.Conn (and only then).
func track(dial *func(context.Context, string, string) (net.Conn, error)) *interrupter {
	in := newInterrupter()
	next := *dial
	*dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return in.conns.Add(c)
	}
	return in
}

// A watch is one driver call's (see interrupter.watch).
type watch struct {
	in     *interrupter
	stopAF func() bool
	done   atomic.Bool
}

// watch has the end of ctx interrupt the reads that block a call made with
// it, until stop. A nil interrupter (a caller's client) does nothing.
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

// maxRounds bounds fire: after a second, go-redis's own timeouts rule.
const maxRounds = 20

// fire notes the reads in progress when the call's context ends and, if
// the call still runs interruptGrace later, cuts those still blocked (a
// read without a deadline, pub/sub's, never). It goes on in rounds: the
// call may have been dialing or writing, or go-redis may retry on a new
// connection.
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
