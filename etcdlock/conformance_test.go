package etcdlock

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// harness runs the conformance suite against one etcd cluster.
type harness struct {
	endpoints []string
	prefix    string
	admin     *clientv3.Client
	probe     *Driver // never used to lock: computes key layouts

	mu      sync.Mutex
	proxies []*faultproxy.Proxy // of NewCutDriver, closed at the end
}

var (
	_ conformance.WaiterCounter  = (*harness)(nil)
	_ conformance.Outager        = (*harness)(nil)
	_ conformance.ResidueCounter = (*harness)(nil)
)

// newHarness connects to endpoints under a prefix unique to the test run.
func newHarness(t *testing.T, endpoints []string) *harness {
	t.Helper()
	testenv.Require(t, endpoints...)
	admin, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	var b [4]byte
	rand.Read(b[:])
	h := &harness{endpoints: endpoints, prefix: "/locker-test/" + hex.EncodeToString(b[:]), admin: admin}
	h.probe, err = New(admin, WithPrefix(h.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		admin.Delete(ctx, h.prefix+"/", clientv3.WithPrefix())
		h.probe.Close()
		admin.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, p := range h.proxies {
			p.Close()
		}
	})
	return h
}

func (h *harness) url() string { return h.urlFor(h.endpoints) }

func (h *harness) urlFor(endpoints []string) string {
	return "etcd://" + strings.Join(endpoints, ",") + h.prefix + "?dial_timeout=5s"
}

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, h.url())
}

// NewCutDriver opens a driver whose client knows only proxies, one per
// endpoint (the client learns no other member: it syncs no endpoints).
func (h *harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	var proxies []*faultproxy.Proxy
	var addrs []string
	for _, ep := range h.endpoints {
		p, err := faultproxy.New(ep)
		if err != nil {
			for _, p := range proxies {
				p.Close()
			}
			return nil, nil, err
		}
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr())
	}
	h.mu.Lock()
	h.proxies = append(h.proxies, proxies...)
	h.mu.Unlock()
	drv, err := Open(ctx, h.urlFor(addrs))
	if err != nil {
		return nil, nil, err
	}
	return drv, func(down bool) {
		for _, p := range proxies {
			p.Refuse(down)
			if down {
				p.Cut()
			}
		}
	}, nil
}

// Residue counts every key under the name's queue directories (lock,
// semaphore, read-write lock) and its semaphore's resize key: the driver
// keeps nothing else per name (fences are etcd revisions).
func (h *harness) Residue(ctx context.Context, key string) (int, error) {
	n, err := h.Entries(ctx, key)
	if err != nil {
		return 0, err
	}
	resp, err := h.admin.Get(ctx, resizeKey(h.dirs(key)[1]), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return n + int(resp.Count), nil
}

// Expire revokes the session lease of key's holder (the lock's, else the
// oldest of the semaphore's or the read-write lock's), as etcd does when
// the holder's session expires.
func (h *harness) Expire(ctx context.Context, key string) error {
	for _, dir := range h.dirs(key) {
		resp, err := h.admin.Get(ctx, dir, clientv3.WithFirstCreate()...)
		if err != nil {
			return err
		}
		if len(resp.Kvs) > 0 {
			_, err = h.admin.Revoke(ctx, sessionOf(resp.Kvs[0].Key))
			return err
		}
	}
	return fmt.Errorf("no holder for %q", key)
}

// sessionOf is the session lease of an entry, named in its key (a delayed
// lock's entry is on a lease of its own, see delay.go).
func sessionOf(key []byte) clientv3.LeaseID {
	name := key[bytes.LastIndexByte(key, '/')+1:]
	id, _ := strconv.ParseInt(string(name[:bytes.LastIndexByte(name, '-')]), 16, 64)
	return clientv3.LeaseID(id)
}

// Entries counts the holders' and the waiters' entries of key's lock,
// semaphore and read-write lock.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	n := 0
	for _, dir := range h.dirs(key) {
		resp, err := h.admin.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		n += int(resp.Count)
	}
	return n, nil
}

// dirs are the directories of key's lock, semaphore and read-write lock.
func (h *harness) dirs(key string) []string {
	sem, _, _ := h.probe.dirs(backend.Claim{Key: key, Mode: backend.Permit, Limit: 1, TTL: time.Second})
	_, rw, _ := h.probe.dirs(backend.Claim{Key: key, Mode: backend.Write, TTL: time.Second})
	return []string{h.probe.Dir(key), sem, rw}
}

func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{
		// etcd's smallest lease (2s with the default election timeout).
		TTL: 2 * time.Second,
		// The leader looks for expired leases every 500ms, then revokes
		// them through raft.
		Granularity: time.Second,
		FIFO:        backend.Modes(backend.Exclusive, backend.Permit),
	}
}

func TestConformance(t *testing.T) {
	t.Run("Single", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.EtcdEndpoints()))
	})
	t.Run("Cluster", func(t *testing.T) {
		conformance.Run(t, newHarness(t, testenv.EtcdClusterEndpoints()))
	})
}
