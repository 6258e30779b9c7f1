package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestLateDeleteSparesTheNextEntry: a Release whose first attempt went
// unanswered (cut after attemptTimeout) and was sent again elsewhere may
// see that first attempt applied later. The entry's key must not name
// the next lock of the same lease meanwhile, or that late delete frees it
// while its holder is not told, and another client takes the name.
func TestLateDeleteSparesTheNextEntry(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testenv.EtcdEndpoints())
	ctx := testCtx(t, time.Minute)
	ep := h.endpoints[0]
	p, err := faultproxy.New(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// Two ways to one server: the client's round robin sends some
	// attempts through the proxy, and their resends the other way.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr(), ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	d := mustNew(t, cli, WithPrefix(h.prefix))
	t.Cleanup(func() { d.Close() })
	other := mustNew(t, h.admin, WithPrefix(h.prefix))
	t.Cleanup(func() { other.Close() })

	const n = 12
	// A TTL long enough that no check of held entries (every TTL/3) runs
	// during the test: a loss is then told only by the driver's own books.
	const ttl = 90 * time.Second
	claims := make([]backend.Claim, n)
	for i := range claims {
		claims[i] = backend.Claim{Key: fmt.Sprintf("late-%d", i), Token: testutil.Token(), TTL: ttl}
		g, err := d.TryAcquire(ctx, claims[i])
		if err != nil {
			t.Fatal(err)
		}
		claims[i].Fence = g.Fence
	}
	const lag = 3 * time.Second // more than attemptTimeout: the attempt is cut, then lands
	p.Delay(lag, 0)
	var lost, taken, cut [n]atomic.Bool
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Go(func() {
			t0 := time.Now()
			if err := d.Release(ctx, c); err != nil {
				return // left to the sweep
			}
			cut[i].Store(time.Since(t0) >= attemptTimeout)
			// The name again at once, on the same lease.
			again := backend.Claim{Key: c.Key, Token: testutil.Token(), TTL: ttl, OnLost: func(error) { lost[i].Store(true) }}
			if _, err := d.TryAcquire(ctx, again); err != nil {
				return // no answer through the proxy, again and again
			}
			taken[i].Store(true)
		})
	}
	wg.Wait()
	// Every attempt sent through the proxy has landed by then.
	time.Sleep(lag + time.Second)
	p.Heal()
	tested := 0
	for i, c := range claims {
		if !taken[i].Load() || !cut[i].Load() {
			continue
		}
		tested++
		probe := backend.Claim{Key: c.Key, Token: testutil.Token(), TTL: ttl}
		_, err := other.TryAcquire(context.Background(), probe)
		if err == nil {
			if !lost[i].Load() {
				t.Errorf("%s: another driver took the name while its holder held it, untold", c.Key)
			}
			other.Release(ctx, probe)
		}
	}
	if tested == 0 {
		t.Fatal("no name was released after a cut attempt and taken again: nothing tested")
	}
	t.Logf("%d of %d names released after a cut attempt and taken again", tested, n)
}
