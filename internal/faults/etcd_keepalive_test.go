package faults

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/etcdlock"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepAliveOffEnv, set, opens the client of TestEtcdKeepAliveDropsDeadConnection
// without gRPC keep-alive (keepalive_time=0): the test must then fail,
// which shows that it is keep-alive that passes it.
const keepAliveOffEnv = "LOCKER_FAULTS_ETCD_KEEPALIVE_OFF"

// TestEtcdKeepAliveDropsDeadConnection: a client of two endpoints (two
// proxies to one etcd) whose connection through the first goes silent for
// good (blackholed: no reset, no close, as when a middlebox drops the flow
// or a host vanishes) stops sending requests there once keep-alive finds
// the connection dead: acquisitions are fast again within keepalive_time +
// keepalive_timeout and a cycle's slack. Without keep-alive, gRPC keeps the
// silent connection ready and round-robin sends every other request down
// it, each cut only by the driver's attempt timeout (2 s), for as long as
// the blackhole lasts. Once the blackhole lifts, locks keep working.
func TestEtcdKeepAliveDropsDeadConnection(t *testing.T) {
	testenv.Require(t, testenv.EtcdEndpoints()...)
	ep := testenv.EtcdEndpoints()[0]
	var ps [2]*faultproxy.Proxy
	for i := range ps {
		p, err := faultproxy.New(ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ps[i] = p
	}
	q := ""
	if os.Getenv(keepAliveOffEnv) != "" {
		q = "?keepalive_time=0"
	}
	ctx := context.Background()
	prefix := fmt.Sprintf("/locker-faults-keepalive/%d", time.Now().UnixNano())
	d, err := etcdlock.Open(ctx, "etcd://"+ps[0].Addr()+","+ps[1].Addr()+prefix+q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = d.Client().Delete(c, prefix, clientv3.WithPrefix())
		d.Close()
	})
	n := 0
	// cycle acquires and releases a new name, within 10 s.
	cycle := func() (time.Duration, error) {
		n++
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l := backend.Claim{Key: fmt.Sprintf("k%d", n), Token: fmt.Sprintf("t%d", n), TTL: 30 * time.Second}
		start := time.Now()
		g, err := d.TryAcquire(c, l)
		if err != nil {
			return time.Since(start), err
		}
		l.Fence = g.Fence
		err = d.Release(c, l)
		return time.Since(start), err
	}
	// Both connections up and used.
	for i := 0; ps[0].Conns() == 0 || ps[1].Conns() == 0; i++ {
		if i == 50 {
			t.Fatalf("not connected through both proxies (%d and %d connections)", ps[0].Conns(), ps[1].Conns())
		}
		if _, err := cycle(); err != nil {
			t.Fatal(err)
		}
	}

	const (
		fast   = time.Second      // a healthy cycle on loopback, with room for a busy machine
		streak = 5                // fast cycles in a row that count as recovered
		bound  = 30 * time.Second // keepalive_time 10s + keepalive_timeout 5s, and the cycles in flight
		giveUp = 45 * time.Second
	)
	ps[0].Blackhole()
	cut := time.Now()
	run, slow := 0, 0
	for time.Since(cut) < giveUp && run < streak {
		took, err := cycle()
		switch {
		case err == nil && took < fast:
			run++
		case err == nil:
			run, slow = 0, slow+1
		default:
			// A cycle may fail while the dead connection holds its
			// requests; the lock must work again once it is dropped.
			t.Logf("%v after the blackhole: %v", time.Since(cut).Round(time.Millisecond), err)
			run = 0
		}
	}
	recovered := time.Since(cut)
	if run < streak {
		t.Fatalf("no %d fast cycles in a row %v after the blackhole (%d slow cycles): the silent connection is still in use", streak, giveUp, slow)
	}
	t.Logf("%d fast cycles in a row %v after the blackhole (%d slow cycles before)", streak, recovered.Round(time.Millisecond), slow)
	if recovered > bound {
		t.Fatalf("recovered %v after the blackhole, want within %v", recovered, bound)
	}

	// Lifted: locks keep working, through either proxy.
	ps[0].Heal()
	for i := range streak {
		if took, err := cycle(); err != nil || took > fast {
			t.Fatalf("cycle %d after the blackhole lifted: %v after %v", i, err, took)
		}
	}
}
