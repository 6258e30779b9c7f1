package zklock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
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
	d, err := dialDriver(ctx, h.servers)
	if err == nil && os.Getenv(brokenEnv) == "no-marker" {
		d.testNoMarker = true
	}
	return d, err
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

// Entries counts the nodes in key's queues: the holders' and the waiters'
// (not their delay markers).
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
		for _, name := range names {
			if _, _, _, ok := parseTagged(name); ok {
				n++
			}
		}
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

// brokenEnv names the breakage of a child process's drivers.
const brokenEnv = "ZKLOCK_BROKEN"

// TestConformanceCatchesNoMarker: drivers whose acquisitions leave no
// delay marker fail LockDelayAfterLoss, in a child process of this test
// binary: the case sees the name granted right after the session's end.
func TestConformanceCatchesNoMarker(t *testing.T) {
	testenv.Require(t, testenv.ZKAddrs()...)
	if os.Getenv(brokenEnv) != "" {
		t.Skip("the child runs the suite")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConformance$/^Single$/^Parallel$/^LockDelayAfterLoss$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), brokenEnv+"=no-marker")
	out, err := cmd.CombinedOutput()
	if err == nil || !regexp.MustCompile(`--- FAIL: TestConformance/Single/Parallel/LockDelayAfterLoss `).Match(out) {
		t.Fatalf("LockDelayAfterLoss passed drivers that leave no marker (%v):\n%s", err, out)
	}
	t.Logf("caught:\n%s", regexp.MustCompile(`(?m)^.*granted again.*$`).Find(out))
}
