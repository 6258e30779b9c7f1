package redislock

// Interruptible connections: go-redis never watches a context while it
// reads a reply, and the backend contract wants a cancelled call back
// within a round trip. So on the clients this package dials, a read still
// blocked conntrack.Grace after its call's context ended is cut
// (Tracker.CutOnEnd). A caller's client is left alone. See
// docs/backends/redislock.md, Cancellation.

import (
	"context"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/internal/conntrack"
)

// interruptible makes the connections of a client built from o
// interruptible by the returned Tracker, and has go-redis honour
// context deadlines itself.
func interruptible(o *redis.Options) *conntrack.Tracker {
	o.ContextTimeoutEnabled = true
	if o.Dialer == nil {
		o.Dialer = redis.NewDialer(o) // reads o's DialTimeout and TLSConfig when it dials
	}
	return track(&o.Dialer)
}

// interruptibleCluster is interruptible for all of a cluster's nodes.
func interruptibleCluster(o *redis.ClusterOptions) *conntrack.Tracker {
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
func track(dial *func(context.Context, string, string) (net.Conn, error)) *conntrack.Tracker {
	t := conntrack.New()
	next := *dial
	*dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return t.Add(c)
	}
	return t
}
