package zklock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// harness runs the suite against one ZooKeeper deployment. Expire ends the
// holder's session on the server, as a session timeout would.
type harness struct {
	t       testing.TB
	servers []string
	watcher *Driver // lists queues; never holds anything
}

func newHarness(t *testing.T, servers []string) *harness {
	testenv.Require(t, servers...)
	return &harness{t: t, servers: servers, watcher: dial(t, servers)}
}

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return dialDriver(ctx, h.servers)
}

func (h *harness) Expire(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return expireKey(ctx, h.servers, h.watcher, key)
}

// containerCheck is how long after a name's last release its node, a
// container, is still there: the servers' znode.container.checkIntervalMs
// (a Java system property, not a zoo.cfg key). 60 s is ZooKeeper's
// default, and bounds the 1 s that scripts/services.sh sets.
const containerCheck = 60 * time.Second

func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{TTL: testTimeout, FIFO: backend.Modes(backend.Exclusive, backend.Permit), Retention: containerCheck}
}

// NewCutDriver dials every server through a proxy of its own, which down
// cuts and refuses.
func (h *harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	var proxies []*faultproxy.Proxy
	closeAll := func() {
		for _, p := range proxies {
			p.Close()
		}
	}
	var addrs []string
	for _, s := range h.servers {
		p, err := faultproxy.New(s)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr())
	}
	d, err := dialDriver(ctx, addrs)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	// The suite closes the driver in its own cleanup, before this one.
	h.t.Cleanup(closeAll)
	var mu sync.Mutex
	down := func(on bool) {
		mu.Lock()
		defer mu.Unlock()
		// Every proxy refuses before any cuts: a client cut from one
		// server reconnects at once, and a connection another proxy
		// accepted before its turn came could be made after its Cut and
		// survive the outage.
		for _, p := range proxies {
			p.Refuse(on)
		}
		for _, p := range proxies {
			if on {
				p.Cut()
			}
		}
	}
	return d, down, nil
}

// Residue counts what the store keeps of key: the nodes of its lock,
// semaphore and read-write lock and their children (queue nodes), seen by
// the harness's own connection.
func (h *harness) Residue(ctx context.Context, key string) (int, error) {
	n := 0
	for _, parent := range objectParents(h.watcher, key) {
		names, err := h.queueNames(parent)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n += 1 + len(names)
	}
	return n, nil
}

// Entries counts the nodes in key's queues: the holders' and the waiters'.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	n := 0
	for _, parent := range objectParents(h.watcher, key) {
		names, err := h.queueNames(parent)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n += len(names)
	}
	return n, nil
}

// queueNames lists parent's children, caught up with the leader.
func (h *harness) queueNames(parent string) ([]string, error) {
	if _, err := h.watcher.conn.Sync(parent); err != nil {
		return nil, err
	}
	names, _, err := h.watcher.conn.Children(parent)
	return names, err
}

var (
	_ conformance.WaiterCounter  = (*harness)(nil)
	_ conformance.Outager        = (*harness)(nil)
	_ conformance.ResidueCounter = (*harness)(nil)
)

func TestConformance(t *testing.T) {
	t.Run("Single", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.ZKAddrs()))
	})
	t.Run("Ensemble", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.ZKEnsemble()))
	})
}
