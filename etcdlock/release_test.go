package etcdlock

import (
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReleaseChecksTheEntry: Release deletes the entry by its key and
// reads what it deleted: a held entry is released; one deleted by hand, or
// replaced by a key put by hand under its name, is reported not held.
func TestReleaseChecksTheEntry(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, 30*time.Second)
	d := mustNew(t, h.admin, WithPrefix(h.prefix))
	t.Cleanup(func() { d.Close() })
	for _, c := range []string{"held", "deleted", "replaced"} {
		// A long TTL: the check of held entries (every TTL/3) does not
		// run before Release.
		l := backend.Claim{Key: "release-" + c, Token: testutil.Token(), TTL: 60 * time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		l.Fence = g.Fence
		resp, err := h.admin.Get(ctx, d.Dir(l.Key), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s: entries %v: %v", c, resp, err)
		}
		key := string(resp.Kvs[0].Key)
		switch c {
		case "deleted":
			_, err = h.admin.Delete(ctx, key)
		case "replaced":
			if _, err = h.admin.Delete(ctx, key); err == nil {
				_, err = h.admin.Put(ctx, key, "stranger")
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		err = d.Release(ctx, l)
		switch {
		case c == "held" && err != nil:
			t.Fatalf("%s: Release = %v", c, err)
		case c != "held" && !errors.Is(err, backend.ErrNotHeld):
			t.Fatalf("%s: Release = %v, want ErrNotHeld", c, err)
		}
		if resp, err := h.admin.Get(ctx, key); err != nil || len(resp.Kvs) != 0 {
			t.Fatalf("%s: the key is still there after Release: %v %v", c, resp.Kvs, err)
		}
		if err := d.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("%s: a second Release = %v, want ErrNotHeld", c, err)
		}
	}
}
