package bench

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/filelock"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/memlock"
	"github.com/lockerhq/locker/redislock"
)

// -floor-duration lengthens the uncontended comparison on Redis, to study
// the Client's path against the bare requests (go test -run
// TestUncontendedRedis -v -args -floor-duration 10s).
var floorDuration = flag.Duration("floor-duration", 0, "duration of TestUncontendedRedis's comparison")

func memClients() clients {
	store := memlock.NewStore()
	return clients{
		open: func(context.Context) (backend.Driver, error) { return memlock.New(store) },
		opts: []locker.Option{locker.WithNamespace("t")}, ns: "t",
	}
}

func redisClients(t *testing.T) clients {
	testenv.Require(t, testenv.RedisAddr())
	ns := "bench-t"
	return clients{
		// Opened as lockctl opens it (interruptible connections).
		open: func(ctx context.Context) (backend.Driver, error) {
			return redislock.Open(ctx, "redis://"+testenv.RedisAddr()+"/0")
		},
		opts: []locker.Option{locker.WithNamespace(ns)}, ns: ns,
	}
}

// checkFloor checks the comparison's shape: every subject timed in every
// round, ratios within each round, the floor at 1x itself.
func checkFloor(t *testing.T, f *Floor, floor bool) {
	t.Helper()
	want := []string{SubjectDriver, SubjectAcquire, SubjectTry, SubjectTryKept, SubjectNoAuto}
	if floor {
		want = append([]string{SubjectFloor}, want...)
	}
	var got []string
	for _, s := range f.Subjects {
		got = append(got, s.Name)
	}
	if f.Supported != floor || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("supported %v, subjects %v; want %v, %v", f.Supported, got, floor, want)
	}
	for _, s := range f.Subjects {
		if s.Ops < f.Rounds*f.Block || s.P50 <= 0 || s.P99 < s.P50 || s.Errors > 0 || s.Slow < 0 || s.Slow > 1 || s.SlowAbove <= 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
		if s.VsDriver.Rounds != f.Rounds || s.VsDriver.Min > s.VsDriver.Median || s.VsDriver.Median > s.VsDriver.Max {
			t.Errorf("%s over the driver: %+v", s.Name, s.VsDriver)
		}
		if floor != (s.VsFloor.Rounds == f.Rounds) {
			t.Errorf("%s over the floor: %+v", s.Name, s.VsFloor)
		}
	}
	if fl := f.Subject(SubjectFloor); floor && (fl.VsFloor.Min != 1 || fl.VsFloor.Max != 1) {
		t.Errorf("the floor over itself: %+v", fl.VsFloor)
	}
	if d := f.Subject(SubjectDriver); d.VsDriver.Median != 1 {
		t.Errorf("the driver over itself: %+v", d.VsDriver)
	}
}

func TestUncontendedMem(t *testing.T) {
	l, f, err := Uncontended(context.Background(), memClients(), Config{Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkFloor(t, f, true)
	if a := f.Subject(SubjectAcquire); l.Ops != a.Ops || l.P50 != a.P50 || l.OpsPerSec <= 0 {
		t.Errorf("uncontended %+v, acquire subject %+v", l, a)
	}
}

// A driver without a raw floor still compares the Client with itself.
func TestUncontendedNoFloor(t *testing.T) {
	dir := t.TempDir()
	// Wrapped without Unwrap: filelock's own raw floor is out of reach.
	type noFloor struct{ backend.Driver }
	cs := clients{open: func(context.Context) (backend.Driver, error) {
		d, err := filelock.New(dir, filelock.WithSync(false))
		return noFloor{d}, err
	}, ns: "t"}
	_, f, err := Uncontended(context.Background(), cs, Config{Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkFloor(t, f, false)
}

func TestUncontendedRedis(t *testing.T) {
	d := cmpOr(*floorDuration, 700*time.Millisecond)
	_, f, err := Uncontended(context.Background(), redisClients(t), Config{Duration: d})
	if err != nil {
		t.Fatal(err)
	}
	checkFloor(t, f, true)
	t.Logf("%d rounds of %d-op blocks", f.Rounds, f.Block)
	for _, s := range f.Subjects {
		t.Logf("%-10s ops %6d p50 %6v p90 %6v p99 %6v  /floor %.2f [%.2f-%.2f]  /driver %.2f [%.2f-%.2f]  slow (>%v) %4.1f%% (rounds %.1f%% [%.1f-%.1f])",
			s.Name, s.Ops, s.P50, s.P90, s.P99, s.VsFloor.Median, s.VsFloor.Min, s.VsFloor.Max,
			s.VsDriver.Median, s.VsDriver.Min, s.VsDriver.Max,
			s.SlowAbove, 100*s.Slow, 100*s.SlowRounds.Median, 100*s.SlowRounds.Min, 100*s.SlowRounds.Max)
	}
	for _, s := range f.Subjects {
		var b strings.Builder
		for _, q := range []float64{.05, .1, .2, .3, .4, .5, .6, .7, .8, .9} {
			fmt.Fprintf(&b, " %3.0f", float64(Percentile(s.samples, q))/1e3)
		}
		t.Logf("%-10s quantiles 5..90%% (µs):%s; slow share over the driver's, per round: %+.1f [%+.1f, %+.1f] points", s.Name, b.String(),
			100*s.SlowOverDriver.Median, 100*s.SlowOverDriver.Min, 100*s.SlowOverDriver.Max)
	}
	// The Client's path costs more than the bare requests it makes.
	if a := f.Subject(SubjectAcquire); a.VsFloor.Median < 1 {
		t.Errorf("acquire+release under the raw floor: %+v", a.VsFloor)
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// checkScale checks a scale run's figures, and that its tries come from
// where they should.
func checkScale(t *testing.T, s Scale, names, workers, nclients int, queued bool, from string) {
	t.Helper()
	if s.Names != names || s.Workers != workers || s.Clients != nclients || s.Queued != queued || s.TriesFrom != from {
		t.Errorf("sizes %+v, want queued %v, tries from %q", s, queued, from)
	}
	if s.Acquisitions < names || s.AcquisitionsSec <= 0 || s.WaitP99 < s.WaitP50 || s.Errors > 0 || s.CPUPerAcq <= 0 {
		t.Errorf("figures %+v", s)
	}
	// Every acquisition took at least one try, when they are counted: but
	// a worker's try just before the window (or an acquisition just after
	// it) is not counted.
	counted := from != TriesNone
	if counted != (s.TryCalls > 0) || counted && s.TryCalls+2*int64(workers) < int64(s.Acquisitions) {
		t.Errorf("%d tries for %d acquisitions (from %q)", s.TryCalls, s.Acquisitions, from)
	}
	if s.Tries != 0 && s.Tries != float64(s.TryCalls)/float64(s.Acquisitions) {
		t.Errorf("%v tries per acquisition, %d tries for %d acquisitions", s.Tries, s.TryCalls, s.Acquisitions)
	}
}

func TestScaleMem(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Duration: 200 * time.Millisecond}
	s, err := RunScale(ctx, memClients(), cfg, 1, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkScale(t, s, 1, 16, 4, false, TriesClient)
	s, err = RunScale(ctx, memClients(), cfg, 50, 200, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkScale(t, s, 50, 200, 4, false, TriesClient)
	if _, err := RunScale(ctx, memClients(), cfg, 4, 2, 1); err == nil {
		t.Error("fewer workers than names ran")
	}
}

// storeTried is a mem driver that counts its own tries as a driver with
// measure.StoreTries does, behind a wrapper that finds it by Unwrap only.
type storeTried struct {
	*memlock.Driver
	n *atomic.Uint64
}

func (d storeTried) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	d.n.Add(1)
	return d.Driver.TryAcquire(ctx, c)
}

func init() {
	measure.RegisterStoreTries(func(d storeTried) uint64 { return d.n.Load() })
}

type unwrapping struct{ backend.Driver }

func (d unwrapping) Unwrap() backend.Driver { return d.Driver }

// A driver that counts its tries (measure.StoreTries), even one that is no
// queued driver, has them counted by its count, over the window only.
func TestScaleStoreTries(t *testing.T) {
	store := memlock.NewStore()
	var counts []*atomic.Uint64 // one per driver
	cs := clients{
		open: func(context.Context) (backend.Driver, error) {
			d, err := memlock.New(store)
			counts = append(counts, new(atomic.Uint64))
			return unwrapping{storeTried{d, counts[len(counts)-1]}}, err
		},
		opts: []locker.Option{locker.WithNamespace("t")}, ns: "t",
	}
	s, err := RunScale(context.Background(), cs, Config{Duration: 200 * time.Millisecond}, 1, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkScale(t, s, 1, 16, 4, false, TriesStore)
	// The warm-up's tries (a third of the run, and the clients' first
	// acquisitions) are left out.
	var total uint64
	for _, n := range counts {
		total += n.Load()
	}
	if len(counts) != 4 || uint64(s.TryCalls) >= total {
		t.Errorf("%d tries counted of %d in all, on %d drivers", s.TryCalls, total, len(counts))
	}
}

// storeMarks counts the tries between the last acquisition before the
// window and the last in it, whatever order the readings come in.
func TestStoreMarks(t *testing.T) {
	t0 := time.Unix(0, 0)
	m := &storeMarks{from: t0.Add(time.Second), to: t0.Add(2 * time.Second), before: 3}
	if m.tries() != 0 {
		t.Errorf("%d tries without acquisitions", m.tries())
	}
	for _, r := range []struct {
		at int // ms
		n  uint64
	}{{500, 10}, {900, 9}, {1000, 14}, {1900, 30}, {1500, 25}, {2000, 40}} {
		m.mark(t0.Add(time.Duration(r.at)*time.Millisecond), r.n)
	}
	if m.tries() != 30-10 {
		t.Errorf("%d tries, want 20", m.tries())
	}
}

// noHerd checks that a release woke O(1) waiters: the tries per
// acquisition stay well under the waiters, which a herd would reach.
func noHerd(t *testing.T, s Scale) {
	t.Helper()
	if s.Tries <= 0 || s.Tries > float64(s.Workers)/4 {
		t.Errorf("%.2f tries per acquisition with %d workers on one name", s.Tries, s.Workers)
	}
}

func TestScaleRedis(t *testing.T) {
	ctx := context.Background()
	cs := redisClients(t)
	cfg := Config{Duration: 300 * time.Millisecond}
	s, err := RunScale(ctx, cs, cfg, 1, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Redis queues its waiters, and counts their tries.
	checkScale(t, s, 1, 16, 4, true, TriesStore)
	noHerd(t, s)
	t.Logf("one name: %+v", s)
	s, err = RunScale(ctx, cs, cfg, 40, 160, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkScale(t, s, 40, 160, 4, true, TriesStore)
	t.Logf("names: %+v", s)
}

// file queues its waiters too (on Linux), and counts their looks.
func TestScaleFile(t *testing.T) {
	dir := t.TempDir()
	cs := clients{
		open: func(context.Context) (backend.Driver, error) { return filelock.New(dir, filelock.WithSync(false)) },
		opts: []locker.Option{locker.WithNamespace("t")}, ns: "t",
	}
	s, err := RunScale(context.Background(), cs, Config{Duration: 300 * time.Millisecond}, 1, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	d, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	queued := queuesLocks(d)
	from := TriesClient
	if queued {
		from = TriesStore
	}
	checkScale(t, s, 1, 16, 4, queued, from)
	noHerd(t, s)
	t.Logf("one name: %+v", s)
}

// The try counter keeps the driver's optional interfaces within reach of
// the Client (backend.As) and counts only TryAcquire.
func TestTryCounter(t *testing.T) {
	mem, err := memlock.New(memlock.NewStore())
	if err != nil {
		t.Fatal(err)
	}
	n := newTries()
	w := tryCounter{mem, n}
	if _, ok := backend.As[backend.Notifier](w); !ok {
		t.Error("the Notifier is out of reach")
	}
	c, err := locker.New(w)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for i := range 3 {
		if err := acquireRelease(ctx, c, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.n.Load(); got != 3 {
		t.Errorf("%d tries counted for 3 uncontended acquisitions", got)
	}
}

func TestScaleClientSpreads(t *testing.T) {
	for _, c := range []struct{ names, workers, clients int }{{1, 64, 8}, {1000, 4000, 4}, {999, 3996, 4}, {3, 12, 2}} {
		per := make([]int, c.clients)
		for n := range c.names {
			seen := map[int]bool{}
			for w := n; w < c.workers; w += c.names {
				k := scaleClient(w, c.names, c.clients)
				per[k]++
				seen[k] = true
			}
			if want := min(c.workers/c.names, c.clients); len(seen) != want {
				t.Errorf("%+v: name %d's workers on %d clients, want %d", c, n, len(seen), want)
			}
		}
		for k, got := range per {
			if got != c.workers/c.clients {
				t.Errorf("%+v: client %d has %d workers, want %d", c, k, got, c.workers/c.clients)
			}
		}
	}
}
