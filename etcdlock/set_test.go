package etcdlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// A set is one transaction: every entry or none, one revision for all;
// the release deletes them in one transaction too.
func TestAcquireAll(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	d := mustNew(t, h.admin, WithPrefix(h.prefix))
	t.Cleanup(func() { d.Close() })
	set := func(keys ...string) []backend.Claim {
		cs := make([]backend.Claim, len(keys))
		for i, k := range keys {
			cs[i] = backend.Claim{Key: k, Token: testutil.Token(), TTL: 60 * time.Second}
		}
		return cs
	}
	entries := func(key string) int {
		resp, err := h.admin.Get(ctx, d.Dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return int(resp.Count)
	}
	cs := set("s/a", "s/b", "s/c")
	gs, err := d.TryAcquireAll(ctx, cs)
	if err != nil || len(gs) != 3 || gs[0].Fence == 0 || gs[0].Fence != gs[2].Fence {
		t.Fatalf("TryAcquireAll of free keys: %+v %v, want one revision as every fence", gs, err)
	}
	for i := range cs {
		cs[i].Fence = gs[i].Fence
	}
	if _, err := d.TryAcquireAll(ctx, set("s/c", "s/d")); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll over a held key: %v, want ErrNotAcquired", err)
	}
	if n := entries("s/d"); n != 0 {
		t.Fatalf("s/d has %d entries after the refused set, want none", n)
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if err != nil {
			t.Fatalf("ReleaseAll %s: %v", cs[i].Key, err)
		}
	}
	for _, k := range []string{"s/a", "s/b", "s/c"} {
		if n := entries(k); n != 0 {
			t.Fatalf("%s has %d entries after ReleaseAll", k, n)
		}
	}
	for i, err := range d.ReleaseAll(ctx, cs) {
		if !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("second ReleaseAll %s: %v, want ErrNotHeld", cs[i].Key, err)
		}
	}
}

// A set costs the requests of one name: one transaction to take it, one
// to release it, one to find it held, however many keys it has.
func TestSetRoundTrips(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	var sent atomic.Int64 // unary requests: not the lease's keep-alive stream
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		sent.Add(1)
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: h.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	d := mustNew(t, cli, WithPrefix(h.prefix))
	t.Cleanup(func() { d.Close() })
	testutil.SetRoundTrips(t, ctx, d, sent.Load) // the lease's grant
	if a, f, r := testutil.SetRoundTrips(t, ctx, d, sent.Load); a != 1 || f != 1 || r != 1 {
		t.Fatalf("requests of a set of 4: acquire %d, refused %d, release %d; want 1 each", a, f, r)
	}
}
