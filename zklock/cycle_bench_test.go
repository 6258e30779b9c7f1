package zklock

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// An uncontended acquire+release on a new name, by four subjects on one
// driver's session: the raw floor (an ephemeral create and a
// delete), the driver's request shape sent bare (the fresh name's 3-op
// multi, then the delete), the driver (TryAcquire + Release) and a Client
// (Acquire + Release), without and with a LockDelay. shape-named is the shape with the driver's node
// names and data.
//
// Every op leaves a name's container node, which the server deletes later
// at its own pace (znode.container.maxPerMinute, 10,000 by default): keep
// runs short (a few thousand ops), or a server with a small heap fills up.
//
//	go test -run '^$' -bench 'Cycle/driver' -cpuprofile /tmp/cpu.out ./zklock

type cycleSubject struct {
	name string
	op   func(ctx context.Context, i int) error
}

func cycleSubjects(b *testing.B) []cycleSubject {
	servers := testenv.ZKAddrs()
	testenv.Require(b, servers...)
	d := dial(b, servers)
	c, err := locker.New(d)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	key := uniqueKey(b)
	floor, _ := measure.RawFloor(d)
	if err := floor(context.Background(), "warm"); err != nil { // makes the root
		b.Fatal(err)
	}
	acl := zk.WorldACL(zk.PermAll)
	return []cycleSubject{
		{"floor", func(ctx context.Context, i int) error { return floor(ctx, fmt.Sprintf("%s/f%d", key, i)) }},
		{"shape", func(ctx context.Context, i int) error {
			parent := d.parentPath(fmt.Sprintf("%s/s%d", key, i))
			_, err := d.conn.Multi(
				&zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1},
				&zk.CreateRequest{Path: parent, Data: []byte{}, Acl: acl, Flags: zk.FlagContainer},
				&zk.CreateRequest{Path: parent + "/lk-", Data: []byte{}, Acl: acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
			)
			if err != nil && err != zk.ErrAPIError {
				return err
			}
			return d.conn.Delete(parent+"/lk-"+firstSeq, -1)
		}},
		{"shape-named", func(ctx context.Context, i int) error {
			parent := d.parentPath(fmt.Sprintf("%s/n%d", key, i))
			prefix := parent + "/" + nodePrefix + tokenHash(newToken(b)) + "-"
			_, err := d.conn.Multi(
				&zk.SetDataRequest{Path: d.root, Data: []byte{}, Version: -1},
				&zk.CreateRequest{Path: parent, Data: []byte{}, Acl: acl, Flags: zk.FlagContainer},
				&zk.CreateRequest{Path: prefix, Data: []byte("bench"), Acl: acl, Flags: zk.FlagEphemeral | zk.FlagSequence},
			)
			if err != nil && err != zk.ErrAPIError {
				return err
			}
			return d.conn.Delete(prefix+firstSeq, -1)
		}},
		{"driver", func(ctx context.Context, i int) error {
			l := backend.Claim{Key: fmt.Sprintf("%s/d%d", key, i), Token: newToken(b), Owner: "bench", TTL: time.Minute, Mode: backend.Exclusive}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		}},
		{"client", func(ctx context.Context, i int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("%s/c%d", key, i))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		// The same with a delay: its marker rides in the same requests.
		{"client-delay", func(ctx context.Context, i int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("%s/cd%d", key, i), locker.LockDelay(time.Minute))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
	}
}

// BenchmarkCycle runs each subject alone (for profiles and allocs/op).
func BenchmarkCycle(b *testing.B) {
	subs := cycleSubjects(b)
	for _, s := range subs {
		b.Run(s.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := s.op(ctx, i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCycleRatios interleaves the subjects op by op, 7 rounds; each
// round's ratio is the floor's median time over the subject's (ops/s over
// the floor's); median, least and greatest of the rounds. allocs/op: per
// subject, over blocks of its own.
func BenchmarkCycleRatios(b *testing.B) {
	subs := cycleSubjects(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ops := make([]func(int) error, len(subs))
	for k, sb := range subs {
		ops[k] = func(i int) error { return sb.op(ctx, i) }
	}
	rounds, per := 7, max(b.N/7, 100)
	b.ResetTimer()
	med, err := bench.OpByOp(rounds, per, ops)
	if err != nil {
		b.Fatal(err)
	}
	allocs := make([]float64, len(subs))
	i := rounds * per * len(subs) // past OpByOp's names: the shapes need new ones
	for s := range subs {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range 200 {
			i++
			if err := subs[s].op(ctx, i); err != nil {
				b.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		allocs[s] = float64(m1.Mallocs-m0.Mallocs) / 200
	}
	b.StopTimer()
	for k := range subs {
		b.ReportMetric(allocs[k], subs[k].name+"-allocs/op")
		if k == 0 {
			continue
		}
		m, lo, hi := bench.Ratios(med[0], med[k])
		b.ReportMetric(m, subs[k].name+"/floor")
		b.ReportMetric(lo, subs[k].name+"/floor-min")
		b.ReportMetric(hi, subs[k].name+"/floor-max")
	}
}
