package peers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/etcdlock"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
)

// etcd: this project's etcdlock against etcd's own concurrency.Mutex, on
// the same client (and, for the Mutex, a session made beforehand):
//
//	cd internal/peers && go test -run '^$' -bench Etcd -benchtime 2000x
//
// Uncontended: one worker, a new name per acquire+release, the subjects
// interleaved op by op over several rounds; each ratio is the
// subject's ops/s over concurrency.Mutex's (or the raw floor's) in the same
// round, reported as the median and range over the rounds. The RPCs each
// subject sends per cycle are counted by a client interceptor.
// Contended: 8 workers on 2 clients, one name, 1 ms hold, through
// internal/bench's harness, rounds of each subject alternating.

// etcdRPCs counts the RPCs a client starts, unary and streams.
type etcdRPCs struct{ n atomic.Int64 }

func (c *etcdRPCs) options() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.n.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.n.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

func etcdClient(b *testing.B, rpcs *etcdRPCs) *clientv3.Client {
	b.Helper()
	testenv.Require(b, testenv.EtcdEndpoints()...)
	cfg := clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if rpcs != nil {
		cfg.DialOptions = rpcs.options()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// interleaved is one contender of an uncontended run (etcd's, ZooKeeper's):
// op runs cycle i.
type interleaved struct {
	name string
	op   func(ctx context.Context, i int) error
}

// interleave runs the subjects op by op, each cycle in a rotated order, for
// rounds rounds of perRound cycles each; it returns each round's median
// cycle per subject, and the requests (as count counts them) each subject
// sent per cycle.
func interleave(b *testing.B, subjects []interleaved, rounds, perRound int, count func() int64) (med [][]time.Duration, perCycle []float64) {
	ctx := context.Background()
	med = make([][]time.Duration, len(subjects))
	sent := make([]int64, len(subjects))
	i := 0
	for range rounds {
		times := make([][]time.Duration, len(subjects))
		for c := range perRound {
			for k := range subjects {
				s := (k + c) % len(subjects) // rotate, so that no one always goes first
				i++
				before := count()
				start := time.Now()
				if err := subjects[s].op(ctx, i); err != nil {
					b.Fatalf("%s: %v", subjects[s].name, err)
				}
				times[s] = append(times[s], time.Since(start))
				sent[s] += count() - before
			}
		}
		for s := range subjects {
			med[s] = append(med[s], bench.Percentile(times[s], 0.5))
		}
	}
	perCycle = make([]float64, len(subjects))
	for s := range subjects {
		perCycle[s] = float64(sent[s]) / float64(rounds*perRound)
	}
	return med, perCycle
}

func BenchmarkEtcdUncontended(b *testing.B) {
	rpcs := &etcdRPCs{}
	cli := etcdClient(b, rpcs)
	run := fmt.Sprintf("/locker-peers/%d", time.Now().UnixNano())
	d, err := etcdlock.New(cli, etcdlock.WithPrefix(run+"/etcdlock"))
	if err != nil {
		b.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	// The driver alone, without the Client's bookkeeping, on its own
	// driver (a Client owns its driver).
	d2, err := etcdlock.New(cli, etcdlock.WithPrefix(run+"/driver"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d2.Close() })
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	// Warm up: the leases, the connection.
	if l, err := c.Acquire(ctx, "warm"); err != nil {
		b.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		b.Fatal(err)
	}
	floor, _ := measure.RawFloor(d2)
	if err := floor(ctx, "warm"); err != nil {
		b.Fatal(err)
	}

	subjects := []interleaved{
		{"mutex", func(ctx context.Context, i int) error {
			m := concurrency.NewMutex(s, fmt.Sprintf("%s/mutex/%d", run, i))
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		}},
		{"etcdlock", func(ctx context.Context, i int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("n%d", i))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"driver", func(ctx context.Context, i int) error {
			l := backend.Claim{Key: fmt.Sprintf("n%d", i), Token: fmt.Sprintf("t%d", i), TTL: 30 * time.Second}
			g, err := d2.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d2.Release(ctx, l)
		}},
		{"floor", func(ctx context.Context, i int) error { return floor(ctx, fmt.Sprintf("f%d", i)) }},
	}
	rounds := 5
	perRound := max(b.N/rounds, 50)
	b.ResetTimer()
	med, perCycle := interleave(b, subjects, rounds, perRound, rpcs.n.Load)
	b.StopTimer()
	for s, sub := range subjects {
		b.ReportMetric(float64(bench.Percentile(med[s], 0.5))/1e3, sub.name+"-µs")
		b.ReportMetric(perCycle[s], sub.name+"-rpcs/op")
	}
	for _, k := range []int{1, 2} {
		m, lo, hi := bench.Ratios(med[0], med[k])
		b.ReportMetric(m, subjects[k].name+"/mutex")
		b.ReportMetric(lo, subjects[k].name+"/mutex-min")
		b.ReportMetric(hi, subjects[k].name+"/mutex-max")
		m, lo, hi = bench.Ratios(med[3], med[k])
		b.ReportMetric(m, subjects[k].name+"/floor")
		b.ReportMetric(lo, subjects[k].name+"/floor-min")
		b.ReportMetric(hi, subjects[k].name+"/floor-max")
	}
	m, lo, hi := bench.Ratios(med[3], med[0])
	b.ReportMetric(m, "mutex/floor")
	b.ReportMetric(lo, "mutex/floor-min")
	b.ReportMetric(hi, "mutex/floor-max")
	_, _ = cli.Delete(ctx, run, clientv3.WithPrefix())
}

func BenchmarkEtcdContended(b *testing.B) {
	const workers = 8
	const perRound = 250
	run := fmt.Sprintf("/locker-peers/%d", time.Now().UnixNano())
	ctx := context.Background()
	clis := []*clientv3.Client{etcdClient(b, nil), etcdClient(b, nil)}
	rttKey := run + "/rtt"
	rt := func(ctx context.Context) error { _, err := clis[0].Put(ctx, rttKey, "x"); return err }
	ours := bench.Contend{Hold: time.Millisecond, Acquisitions: perRound, RoundTrip: rt, RoundTripOp: "put", RoundTripEvery: 20 * time.Millisecond}
	theirs := ours
	var cs []*locker.Client
	var ds []*etcdlock.Driver
	for _, cli := range clis {
		d, err := etcdlock.New(cli, etcdlock.WithPrefix(run+"/etcdlock"))
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
		c, err := locker.New(d)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	for w := range workers {
		ours.Workers = append(ours.Workers, bench.Worker{Client: w % 2, Acquire: bench.ClientAcquirer(cs[w%2], "contended")})
		// A Mutex needs a session of its own: two Mutexes of one session on
		// one name share a key, and both "hold" the lock.
		s, err := concurrency.NewSession(clis[w%2])
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		m := concurrency.NewMutex(s, run+"/mutex")
		theirs.Workers = append(theirs.Workers, bench.Worker{Client: w % 2, Acquire: func(ctx context.Context) (func(context.Context) error, error) {
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return m.Unlock, nil
		}})
	}
	// The requests that could grant a waiting acquisition, per acquisition
	// (measure.StoreTries): 2 when a release wakes only the next in line
	// (the waiter's first transaction, and its look after the delete).
	tries := func() (n uint64) {
		for _, d := range ds {
			st, _ := measure.StoreTries(d)
			n += st()
		}
		return n
	}
	var om, tm *bench.Samples
	var ratios []float64
	tries0 := tries()
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
	b.ReportMetric(float64(tries()-tries0)/float64(om.Summary().Acquisitions), "etcdlock-tries/acq")
	om.Summary().Report(b, "etcdlock")
	tm.Summary().Report(b, "mutex")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "etcdlock/mutex-acq/s")
	b.ReportMetric(ratios[0], "etcdlock/mutex-acq/s-min")
	b.ReportMetric(ratios[len(ratios)-1], "etcdlock/mutex-acq/s-max")
	_, _ = clis[0].Delete(ctx, run, clientv3.WithPrefix())
}

// attemptCut is how one variant bounds an attempt of a request: it returns
// the attempt's context and what ends it.
type attemptCut func(ctx context.Context) (context.Context, func())

// sharedCutter cuts every attempt still running two to three ticks after it
// began, one ticker for all: no timer per attempt, no grpc-timeout header.
type sharedCutter struct {
	mu      sync.Mutex
	buckets [3]map[*context.CancelFunc]struct{}
	cur     int
}

func newSharedCutter(b *testing.B, tick time.Duration) *sharedCutter {
	c := &sharedCutter{}
	for i := range c.buckets {
		c.buckets[i] = map[*context.CancelFunc]struct{}{}
	}
	t := time.NewTicker(tick)
	stop := make(chan struct{})
	b.Cleanup(func() { t.Stop(); close(stop) })
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			c.mu.Lock()
			c.cur = (c.cur + 1) % len(c.buckets)
			old := c.buckets[c.cur] // registered three ticks ago at most
			c.buckets[c.cur] = map[*context.CancelFunc]struct{}{}
			c.mu.Unlock()
			for f := range old {
				(*f)()
			}
		}
	}()
	return c
}

func (c *sharedCutter) cut(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	bk := c.buckets[c.cur]
	bk[&cancel] = struct{}{}
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(bk, &cancel)
		c.mu.Unlock()
		cancel()
	}
}

// BenchmarkEtcdAttempt compares ways of bounding each request's attempt on
// the driver's two requests of an uncontended cycle (its enqueue
// transaction and its release's delete), sent raw on one client and lease,
// interleaved op by op with concurrency.Mutex and the driver itself:
//
//	cd internal/peers && go test -run '^$' -bench EtcdAttempt -benchtime 7000x
//
// Each raw variant runs under a per-call cancellable context cut when a
// "closing" context ends, as the driver's gate makes one.
func BenchmarkEtcdAttempt(b *testing.B) {
	const timeout = 2 * time.Second
	cli := etcdClient(b, nil)
	run := fmt.Sprintf("/locker-peers/%d", time.Now().UnixNano())
	d, err := etcdlock.New(cli, etcdlock.WithPrefix(run+"/driver"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	lease := s.Lease() // kept alive by the session
	closing, closeAll := context.WithCancel(ctx)
	b.Cleanup(closeAll)
	shared := newSharedCutter(b, timeout/2)
	cuts := []struct {
		name string
		cut  attemptCut
	}{
		{"deadline+leader", func(ctx context.Context) (context.Context, func()) {
			return context.WithTimeout(clientv3.WithRequireLeader(ctx), timeout)
		}},
		{"deadline", func(ctx context.Context) (context.Context, func()) { return context.WithTimeout(ctx, timeout) }},
		{"timer+leader", func(ctx context.Context) (context.Context, func()) {
			ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			t := time.AfterFunc(timeout, cancel)
			return ctx, func() { t.Stop(); cancel() }
		}},
		{"timer", func(ctx context.Context) (context.Context, func()) {
			ctx, cancel := context.WithCancel(ctx)
			t := time.AfterFunc(timeout, cancel)
			return ctx, func() { t.Stop(); cancel() }
		}},
		{"shared+leader", func(ctx context.Context) (context.Context, func()) {
			return shared.cut(clientv3.WithRequireLeader(ctx))
		}},
		{"shared", shared.cut},
		{"none", func(ctx context.Context) (context.Context, func()) { return ctx, func() {} }},
	}
	cycle := func(ctx context.Context, cut attemptCut, i int, gate bool) error {
		if gate {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			stop := context.AfterFunc(closing, cancel)
			defer func() { stop(); cancel() }()
		}
		dir := fmt.Sprintf("%s/raw/%d/", run, i)
		key := dir + "0"
		actx, end := cut(ctx)
		_, err := cli.Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "owner", clientv3.WithLease(lease)),
				clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
			Commit()
		end()
		if err != nil {
			return err
		}
		actx, end = cut(ctx)
		_, err = cli.Delete(actx, key, clientv3.WithPrevKV())
		end()
		return err
	}
	subjects := []interleaved{
		{"mutex", func(ctx context.Context, i int) error {
			m := concurrency.NewMutex(s, fmt.Sprintf("%s/mutex/%d", run, i))
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		}},
		{"driver", func(ctx context.Context, i int) error {
			l := backend.Claim{Key: fmt.Sprintf("n%d", i), Token: fmt.Sprintf("t%d", i), TTL: 30 * time.Second}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		}},
		{"raw", func(ctx context.Context, i int) error { return cycle(ctx, cuts[len(cuts)-1].cut, i, false) }},
	}
	for _, c := range cuts {
		subjects = append(subjects, interleaved{"gate+" + c.name, func(ctx context.Context, i int) error { return cycle(ctx, c.cut, i, true) }})
	}
	for i := range 20 { // warm up: the leases, the connection
		for _, sub := range subjects {
			if err := sub.op(ctx, -1-i); err != nil {
				b.Fatal(err)
			}
		}
	}
	rounds := 7
	perRound := max(b.N/rounds/len(subjects), 50)
	b.ResetTimer()
	med, _ := interleave(b, subjects, rounds, perRound, func() int64 { return 0 })
	b.StopTimer()
	for k, sub := range subjects {
		m, lo, hi := bench.Ratios(med[0], med[k])
		b.ReportMetric(float64(bench.Percentile(med[k], 0.5))/1e3, sub.name+"-µs")
		b.ReportMetric(m, sub.name+"/mutex")
		fmt.Printf("%-22s %7.1f µs  %.3fx the mutex [%.3f–%.3f] over %d rounds of %d\n", sub.name, float64(bench.Percentile(med[k], 0.5))/1e3, m, lo, hi, rounds, perRound)
	}
	_, _ = cli.Delete(ctx, run, clientv3.WithPrefix())
}
