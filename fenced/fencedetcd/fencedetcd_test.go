package fencedetcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedetcd"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// A holder paused past its TTL wakes after the next holder has written:
// its guarded write is refused, the later one stays; unguarded, the stale
// write lands over it.
func TestPausedHolderRefused(t *testing.T) {
	testenv.Require(t, testenv.EtcdEndpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	dir := "/fenced-" + testutil.RandHex(4)
	defer cli.Delete(context.Background(), dir, clientv3.WithPrefix())
	fk, key := dir+"/fence", dir+"/balance"
	get := func() string {
		r, err := cli.Get(ctx, key)
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("get: %v %v", r, err)
		}
		return string(r.Kvs[0].Value)
	}

	store := memlock.NewStore()
	a, b := client(t, store), client(t, store)
	la, err := a.Acquire(ctx, "account", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk, la.Fence(), clientv3.OpPut(key, "a")); err != nil {
		t.Fatalf("a's first write (no fence yet): %v", err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk, la.Fence(), clientv3.OpPut(key, "a2")); err != nil {
		t.Fatalf("a's second write, same fence: %v", err)
	}
	lb, err := b.Acquire(ctx, "account") // after a's TTL: a is paused
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	if _, err := fencedetcd.Txn(ctx, cli, fk, lb.Fence(), clientv3.OpPut(key, "b")); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk, la.Fence(), clientv3.OpPut(key, "a-late")); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("a's write after b's: %v, want ErrStale", err)
	}
	if v := get(); v != "b" {
		t.Fatalf("the key holds %q, want b's", v)
	}
	cli.Put(ctx, key, "a-late") // bypassed
	if v := get(); v != "a-late" {
		t.Fatalf("unguarded, the key holds %q; want the stale write to land", v)
	}
	// Fences compare as numbers, not as strings: 10 after 9.
	fk2 := dir + "/fence2"
	for _, f := range []uint64{9, 10, 1 << 62} {
		if _, err := fencedetcd.Txn(ctx, cli, fk2, f); err != nil {
			t.Fatalf("fence %d: %v", f, err)
		}
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk2, 10); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("10 after 2^62: %v, want ErrStale", err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk2, 0); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("fence 0: %v, want ErrInvalid", err)
	}
}

func client(t *testing.T, s *memlock.Store) *locker.Client {
	d, err := memlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
