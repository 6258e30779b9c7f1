package otellocker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/memlock"
	"github.com/lockerhq/locker/otellocker"
	"github.com/lockerhq/locker/redislock"
)

// telemetry is an Observer wired to in-memory exporters.
type telemetry struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	obs    *locker.Observer
}

func newTelemetry(t *testing.T) *telemetry {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	obs, err := otellocker.New(otellocker.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otellocker.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	return &telemetry{reader: reader, spans: spans, obs: obs}
}

// scenario drives two Clients of one process through a script whose
// telemetry is known exactly.
func scenario(t *testing.T, open func(t *testing.T) backend.Driver) *telemetry {
	ctx := context.Background()
	tel := newTelemetry(t)
	ns := "otel" + time.Now().Format("150405.000000")[7:]
	client := func(obs *locker.Observer) *locker.Client {
		c, err := locker.New(open(t), locker.WithObserver(obs), locker.WithNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// c2's Observer is tel's, and also says when a waiting Acquire starts.
	waiting := make(chan struct{}, 1)
	obs2 := *tel.obs
	obs2.AcquireStart = func(ctx context.Context, e locker.AcquireStartEvent) context.Context {
		if e.Wait {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
		if tel.obs.AcquireStart != nil {
			return tel.obs.AcquireStart(ctx, e)
		}
		return nil
	}
	c1, c2 := client(tel.obs), client(&obs2)

	a, err := c1.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.TryAcquire(ctx, "job"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock = %v", err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		b, err := c2.Acquire(ctx, "job")
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	// The waiter's first try must find the lock held (contention counts
	// it): release 100ms after its AcquireStart, not after its goroutine
	// was started, which a loaded machine may run late.
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter's AcquireStart was not seen within 10s")
	}
	time.Sleep(100 * time.Millisecond)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		t.FailNow()
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := c1.Do(ctx, "report", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v", err)
	}
	short, err := c1.TryAcquire(ctx, "short", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-short.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a lock without refreshes was not lost after its TTL")
	}
	// The Lost hook runs just after the channel closes, on the watchdog's
	// goroutine: wait (bounded) until it has counted the loss, rather than
	// for a time a loaded machine may not run it in.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		got := points(t, tel.reader)
		if got["locker.lost"]["locker.lost.cause=expired "] >= 1 && got["locker.hold.duration"]["locker.outcome=lost "] >= 1 {
			break
		}
	}
	return tel
}

// points sums each metric's data points by their attributes.
func points(t *testing.T, r *sdkmetric.ManualReader) map[string]map[string]float64 {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			byAttr := map[string]float64{}
			key := func(s attribute.Set) string {
				var k string
				for _, kv := range s.ToSlice() {
					if kv.Key != "locker.namespace" && kv.Key != "locker.mode" {
						k += string(kv.Key) + "=" + kv.Value.Emit() + " "
					}
				}
				return k
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					byAttr[key(p.Attributes)] += float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					byAttr[key(p.Attributes)] += float64(p.Count)
				}
			}
			out[m.Name] = byAttr
		}
	}
	return out
}

func check(t *testing.T, tel *telemetry) {
	t.Helper()
	got := points(t, tel.reader)
	want := map[string]map[string]float64{
		"locker.acquire.duration": {
			"locker.outcome=granted locker.wait=false ": 2, // job, short
			"locker.outcome=refused locker.wait=false ": 1,
			"locker.outcome=granted locker.wait=true ":  2, // the waiter, Do's
		},
		"locker.contention": {"": 2},
		"locker.held":       {"": 0},
		"locker.hold.duration": {
			"locker.outcome=released ": 3,
			"locker.outcome=lost ":     1,
		},
		"locker.lost": {"locker.lost.cause=expired ": 1},
	}
	for name, w := range want {
		for attrs, v := range w {
			if g := got[name][attrs]; g != v {
				t.Errorf("%s{%s} = %v, want %v (all: %v)", name, attrs, g, v, got[name])
			}
		}
	}
	if n := len(got["locker.store.errors"]); n != 0 {
		t.Errorf("store errors reported on a healthy store: %v", got["locker.store.errors"])
	}

	spans := tel.spans.GetSpans()
	var do tracetest.SpanStub
	acquires := 0
	for _, s := range spans {
		switch s.Name {
		case "locker.do":
			do = s
		case "locker.acquire":
			acquires++
		}
	}
	if acquires != 5 || do.Name == "" {
		t.Fatalf("spans: %d locker.acquire and do %q, want 5 and one locker.do", acquires, do.Name)
	}
	if do.Status.Code != codes.Error {
		t.Errorf("locker.do of a failing fn has status %v, want Error", do.Status)
	}
	nested := false
	for _, s := range spans {
		if s.Name == "locker.acquire" && s.Parent.SpanID() == do.SpanContext.SpanID() {
			nested = true
			mode := ""
			for _, kv := range s.Attributes {
				if kv.Key == "locker.fence" && kv.Value.AsInt64() == 0 {
					t.Errorf("Do's acquisition span has fence 0")
				}
				if kv.Key == "locker.mode" {
					mode = kv.Value.AsString()
				}
			}
			if mode != "exclusive" {
				t.Errorf("Do's acquisition span has locker.mode %q, want exclusive", mode)
			}
		}
	}
	if !nested {
		t.Error("Do's acquisition span is not a child of its locker.do span")
	}
}

func TestScenarioMem(t *testing.T) {
	store := memlock.NewStore()
	tel := scenario(t, func(*testing.T) backend.Driver {
		d, err := memlock.New(store)
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
	check(t, tel)
}

func TestScenarioRedis(t *testing.T) {
	addr := testenv.RedisAddr()
	testenv.Require(t, addr)
	tel := scenario(t, func(t *testing.T) backend.Driver {
		// A server CI just started refuses new names for a TTL (the restart
		// delay); this test is not about that.
		d, err := redislock.Open(context.Background(), "redis://"+addr+"/0?restart_delay=0")
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
	check(t, tel)
}
