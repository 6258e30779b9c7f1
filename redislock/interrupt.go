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
	t := conntrack.New()
	o.Dialer = t.Dialer(o.Dialer)
	return t
}

// interruptibleCluster is interruptible for all of a cluster's nodes.
func interruptibleCluster(o *redis.ClusterOptions) *conntrack.Tracker {
	o.ContextTimeoutEnabled = true
	if o.Dialer == nil {
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})(ctx, network, addr)
		}
	}
	t := conntrack.New()
	o.Dialer = t.Dialer(o.Dialer)
	return t
}
