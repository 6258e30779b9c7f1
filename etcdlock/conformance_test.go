package etcdlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
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
}

var _ conformance.WaiterCounter = (*harness)(nil)

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
	})
	return h
}

func (h *harness) url() string {
	return "etcd://" + strings.Join(h.endpoints, ",") + h.prefix + "?dial_timeout=5s"
}

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, h.url())
}

// Expire revokes the lease of key's holder, as etcd does when the holder's
// session expires.
func (h *harness) Expire(ctx context.Context, key string) error {
	resp, err := h.admin.Get(ctx, h.probe.Dir(key), clientv3.WithFirstCreate()...)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("no holder for %q", key)
	}
	_, err = h.admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	return err
}

// Entries counts the holder's and the waiters' entries of key.
func (h *harness) Entries(ctx context.Context, key string) (int, error) {
	resp, err := h.admin.Get(ctx, h.probe.Dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{
		// etcd's smallest lease (2s with the default election timeout).
		TTL: 2 * time.Second,
		// The leader looks for expired leases every 500ms, then revokes
		// them through raft.
		Granularity: time.Second,
		FIFO:        true,
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
