package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
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

func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{TTL: testTimeout, FIFO: true}
}

// Entries counts the nodes in key's queue: the holder's and the waiters'.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	parent := h.watcher.parentPath(key)
	if _, err := h.watcher.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return 0, err
	}
	names, _, err := h.watcher.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(names), err
}

var _ conformance.WaiterCounter = (*harness)(nil)

func TestConformance(t *testing.T) {
	t.Run("Single", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.ZKAddrs()))
	})
	t.Run("Ensemble", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.ZKEnsemble()))
	})
}
