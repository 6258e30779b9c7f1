package peers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/zklock"
)

// ZooKeeper: this project's zklock against go-zookeeper's zk.Lock and the
// raw floor (an ephemeral node created and deleted), on the same session:
//
//	cd internal/peers && go test -run '^$' -bench ZK -benchtime 2000x
//
// Uncontended: one worker, a new name per acquire+release, interleaved op
// by op over several rounds (see interleave); the requests each
// subject sends per cycle are counted on the connection (the zk client
// writes each request, and each ping, in one Write). "shape" sends
// zklock's own requests for a new name bare, without the driver: the
// least the driver's design can cost, against the floor's create and
// delete.
// Contended: 8 workers on 8 sessions, one name, 1 ms hold, through
// internal/bench's harness, rounds of each subject alternating.

// zkWrites counts the writes on the connections it dials.
type zkWrites struct{ n atomic.Int64 }

type zkCountedConn struct {
	net.Conn
	w *zkWrites
}

func (c zkCountedConn) Write(p []byte) (int, error) {
	c.w.n.Add(1)
	return c.Conn.Write(p)
}

func (w *zkWrites) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return zkCountedConn{c, w}, nil
}

func zkDriver(b *testing.B, root string, opts ...zklock.Option) *zklock.Driver {
	b.Helper()
	testenv.Require(b, testenv.ZKAddrs()...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := zklock.Dial(ctx, testenv.ZKAddrs(), append([]zklock.Option{zklock.WithRoot(root), zklock.WithSessionTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// zkRemove deletes path and everything under it (zk.Lock leaves its
// persistent parents behind).
func zkRemove(conn *zk.Conn, path string) {
	names, _, _ := conn.Children(path)
	for _, n := range names {
		zkRemove(conn, path+"/"+n)
	}
	_ = conn.Delete(path, -1)
}

func BenchmarkZKUncontended(b *testing.B) {
	writes := &zkWrites{}
	run := fmt.Sprintf("/locker-peers-%d", time.Now().UnixNano())
	// One session for the Client, the driver alone, the floor and zk.Lock.
	d := zkDriver(b, run+"/zklock", zklock.WithDialer(writes.dial))
	c, err := locker.New(d)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	conn := d.Conn()
	b.Cleanup(func() { zkRemove(conn, run) })
	ctx := context.Background()
	floor, _ := measure.RawFloor(d)
	if err := floor(ctx, "warm"); err != nil { // makes the root
		b.Fatal(err)
	}
	subjects := []interleaved{
		{"floor", func(ctx context.Context, i int) error { return floor(ctx, fmt.Sprintf("f%d", i)) }},
		{"zklock", func(ctx context.Context, i int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("n%d", i))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"driver", func(ctx context.Context, i int) error {
			l := backend.Claim{Key: fmt.Sprintf("d%d", i), Token: fmt.Sprintf("t%d", i), TTL: 10 * time.Second}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		}},
		{"zk.Lock", func(ctx context.Context, i int) error {
			l := zk.NewLock(conn, fmt.Sprintf("%s/zklock-peer/%d", run, i), zk.WorldACL(zk.PermAll))
			if err := l.Lock(); err != nil {
				return err
			}
			return l.Unlock()
		}},
		// zklock's requests for a new name, sent bare: the multi-op that
		// writes the root (its stat carries the fence) and makes the
		// name's container node and the queue node, then the delete.
		{"shape", func(ctx context.Context, i int) error {
			root := run + "/zklock"
			p := fmt.Sprintf("%s/s%d", root, i)
			acl := zk.WorldACL(zk.PermAll)
			_, err := conn.Multi(
				&zk.SetDataRequest{Path: root, Data: []byte{}, Version: -1},
				&zk.CreateRequest{Path: p, Data: []byte{}, Acl: acl, Flags: zk.FlagContainer},
				&zk.CreateRequest{Path: p + "/x-", Acl: acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
			)
			if err != nil && !errors.Is(err, zk.ErrAPIError) { // the zk client cannot read a container's create: see zklock's createFresh
				return err
			}
			return conn.Delete(p+"/x-0000000000", -1)
		}},
	}
	rounds := 5
	perRound := max(b.N/rounds, 50)
	b.ResetTimer()
	med, perCycle := interleave(b, subjects, rounds, perRound, writes.n.Load)
	b.StopTimer()
	for s, sub := range subjects {
		b.ReportMetric(float64(bench.Percentile(med[s], 0.5))/1e3, sub.name+"-µs")
		b.ReportMetric(perCycle[s], sub.name+"-requests/op")
	}
	for _, k := range []int{1, 2, 3, 4} {
		m, lo, hi := bench.Ratios(med[0], med[k])
		b.ReportMetric(m, subjects[k].name+"/floor")
		b.ReportMetric(lo, subjects[k].name+"/floor-min")
		b.ReportMetric(hi, subjects[k].name+"/floor-max")
	}
	// Ours over the bare requests: what the driver and the Client add.
	for _, k := range []int{1, 2} {
		m, lo, hi := bench.Ratios(med[4], med[k])
		b.ReportMetric(m, subjects[k].name+"/shape")
		b.ReportMetric(lo, subjects[k].name+"/shape-min")
		b.ReportMetric(hi, subjects[k].name+"/shape-max")
	}
	m, lo, hi := bench.Ratios(med[3], med[1])
	b.ReportMetric(m, "zklock/zk.Lock")
	b.ReportMetric(lo, "zklock/zk.Lock-min")
	b.ReportMetric(hi, "zklock/zk.Lock-max")
}

func BenchmarkZKContended(b *testing.B) {
	const workers = 8
	const perRound = 250
	run := fmt.Sprintf("/locker-peers-%d", time.Now().UnixNano())
	ctx := context.Background()
	probe := zkDriver(b, run+"/probe").Conn()
	b.Cleanup(func() { zkRemove(probe, run) })
	rt := func(context.Context) error { _, _, err := probe.Exists("/"); return err }
	ours := bench.Contend{Hold: time.Millisecond, Acquisitions: perRound, RoundTrip: rt, RoundTripOp: "exists"}
	theirs := ours
	for w := range workers {
		d := zkDriver(b, run+"/zklock")
		c, err := locker.New(d)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		ours.Workers = append(ours.Workers, bench.Worker{Client: w, Acquire: bench.ClientAcquirer(c, "contended")})
		zl := zk.NewLock(zkDriver(b, run+"/peer").Conn(), run+"/zklock-peer", zk.WorldACL(zk.PermAll))
		theirs.Workers = append(theirs.Workers, bench.Worker{Client: w, Acquire: func(context.Context) (func(context.Context) error, error) {
			if err := zl.Lock(); err != nil {
				return nil, err
			}
			return func(context.Context) error { return zl.Unlock() }, nil
		}})
	}
	var om, tm *bench.Samples
	var ratios []float64
	b.ResetTimer()
	for range max(b.N/perRound, 5) {
		o, err := ours.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t, err := theirs.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ratios = append(ratios, o.Summary().AcquisitionsSec/t.Summary().AcquisitionsSec)
		if om == nil {
			om, tm = o, t
		} else {
			om.Add(o)
			tm.Add(t)
		}
	}
	b.StopTimer()
	om.Summary().Report(b, "zklock")
	tm.Summary().Report(b, "zk.Lock")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "zklock/zk.Lock-acq/s")
	b.ReportMetric(ratios[0], "zklock/zk.Lock-acq/s-min")
	b.ReportMetric(ratios[len(ratios)-1], "zklock/zk.Lock-acq/s-max")
}
