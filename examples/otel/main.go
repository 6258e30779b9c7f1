// Command otel runs a small service with the OpenTelemetry adapter
// (otellocker) and prints the metrics and spans it produced: workers
// contending for two lock names with Do, and one lock left to expire.
//
//	cd examples/otel && go run .                         # redis://127.0.0.1:6379/0
//	LOCKER_URL=etcd://127.0.0.1:2379 go run .
//
// It is a module of its own, so that the OpenTelemetry SDK reaches nobody
// who does not build it.
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/otellocker"

	// Every backend the example may be pointed at.
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/zklock"
)

const (
	workers = 4
	rounds  = 3
)

var names = []string{"invoices", "reports"}

func main() {
	url := os.Getenv("LOCKER_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, url, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run runs the service on the backend at url and writes what the
// telemetry recorded to w.
func run(ctx context.Context, url string, w io.Writer) error {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	obs, err := otellocker.New(
		otellocker.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otellocker.WithTracerProvider(tp),
		// Few, fixed names: each gets its own series.
		otellocker.WithNameAttribute(true),
	)
	if err != nil {
		return err
	}
	client, err := locker.Open(ctx, url, locker.WithObserver(obs), locker.WithNamespace("example-otel"))
	if err != nil {
		return err
	}
	defer client.Close()

	// The service: workers take turns on two names; each turn is a Do.
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for i := range workers {
		wg.Go(func() {
			name := names[i%len(names)]
			for range rounds {
				err := client.Do(ctx, name, func(ctx context.Context) error {
					time.Sleep(20 * time.Millisecond) // the work
					return nil
				}, locker.Label(fmt.Sprintf("worker-%d", i)))
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}

	// A lock whose holder stopped refreshing it: lost when its TTL ran out.
	l, err := client.TryAcquire(ctx, "heartbeat", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false), locker.Label("stalled"))
	if err != nil {
		return err
	}
	select {
	case <-l.Lost():
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	l.Release(ctx) // reports the loss; the hook counted it already
	// The Lost hook runs just after the channel closes.
	time.Sleep(50 * time.Millisecond)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Fprintln(w, "metrics:")
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(w, "  %s (%s)\n", m.Name, m.Unit)
			var lines []string
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("    %-42s value=%d", attrs(p.Attributes.ToSlice()), p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("    %-42s count=%d sum=%s", attrs(p.Attributes.ToSlice()), p.Count, seconds(p.Sum)))
				}
			}
			slices.Sort(lines)
			fmt.Fprintln(w, strings.Join(lines, "\n"))
		}
	}

	// Spans: each root (a Do, or an acquisition of its own) with its
	// children below it, by start time.
	fmt.Fprintln(w, "spans:")
	ss := spans.GetSpans()
	slices.SortStableFunc(ss, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	children := map[trace.SpanID][]tracetest.SpanStub{}
	for _, s := range ss {
		if s.Parent.IsValid() {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		}
	}
	var print func(s tracetest.SpanStub, indent string)
	print = func(s tracetest.SpanStub, indent string) {
		status := s.Status.Code.String()
		if s.Status.Code == codes.Error {
			status += " " + s.Status.Description
		}
		fmt.Fprintf(w, "  %s%-*s %8s  %s  %s\n", indent, 16-len(indent), s.Name,
			s.EndTime.Sub(s.StartTime).Round(10*time.Microsecond), status, attrs(s.Attributes))
		for _, c := range children[s.SpanContext.SpanID()] {
			print(c, indent+"  ")
		}
	}
	for _, s := range ss {
		if !s.Parent.IsValid() {
			print(s, "")
		}
	}
	return nil
}

// attrs prints attributes sorted by key, without the locker. prefix and
// the namespace, which is the same everywhere.
func attrs(kvs []attribute.KeyValue) string {
	slices.SortFunc(kvs, func(a, b attribute.KeyValue) int { return cmp.Compare(a.Key, b.Key) })
	var b strings.Builder
	for _, kv := range kvs {
		if kv.Key == "locker.namespace" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", strings.TrimPrefix(string(kv.Key), "locker."), kv.Value.Emit())
	}
	return b.String()
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond).String()
}
