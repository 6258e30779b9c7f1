package otellocker

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockerhq/locker"
)

// scope is the instrumentation scope's name.
const scope = "github.com/lockerhq/locker/otellocker"

type config struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	withName bool
}

// Option configures New.
type Option func(*config)

// WithMeterProvider sets where metrics go (default: otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithTracerProvider sets where spans go (default: otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithNameAttribute adds the lock's name (locker.name) to every metric's
// attributes. Only for services with a small, fixed set of lock names.
func WithNameAttribute(on bool) Option { return func(c *config) { c.withName = on } }

// instruments are the metrics New records.
type instruments struct {
	acquire, hold                      metric.Float64Histogram
	held                               metric.Int64UpDownCounter
	contention, lost, refreshFail, err metric.Int64Counter
}

// New returns an Observer that records the Client's events as metrics and
// spans. Pass it with locker.WithObserver.
func New(opts ...Option) (*locker.Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.mp == nil || cfg.tp == nil {
		return nil, errors.New("otellocker: nil MeterProvider or TracerProvider")
	}
	m := cfg.mp.Meter(scope)
	var ins instruments
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	ins.acquire, err = m.Float64Histogram("locker.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an acquisition to the store's answer, waiting included."))
	add(err)
	ins.hold, err = m.Float64Histogram("locker.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a lock was held, from its grant to its release or loss."))
	add(err)
	ins.held, err = m.Int64UpDownCounter("locker.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held by this process."))
	add(err)
	ins.contention, err = m.Int64Counter("locker.contention", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisitions that found the lock held by another."))
	add(err)
	ins.lost, err = m.Int64Counter("locker.lost", metric.WithUnit("{lock}"),
		metric.WithDescription("Held locks found lost, by cause."))
	add(err)
	ins.refreshFail, err = m.Int64Counter("locker.refresh.failures", metric.WithUnit("{refresh}"),
		metric.WithDescription("Refreshes that failed: transient (retried) or proving the lock lost."))
	add(err)
	ins.err, err = m.Int64Counter("locker.store.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed calls to the store, by operation and whether they are retried."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otellocker: %w", err)
	}
	o := &observer{cfg: cfg, ins: ins, tracer: cfg.tp.Tracer(scope)}
	return &locker.Observer{
		AcquireStart: o.acquireStart,
		AcquireDone:  o.acquireDone,
		DoStart:      o.doStart,
		DoDone:       o.doDone,
		Refreshed:    o.refreshed,
		Lost:         o.lostLock,
		Released:     o.released,
		StoreError:   o.storeError,
	}, nil
}

type observer struct {
	cfg    config
	ins    instruments
	tracer trace.Tracer
}

// attrs are the metric attributes of ref plus extra.
func (o *observer) attrs(ref locker.LockRef, extra ...attribute.KeyValue) metric.MeasurementOption {
	kv := make([]attribute.KeyValue, 0, 3+len(extra))
	kv = append(kv, attribute.String("locker.namespace", ref.Namespace), attribute.String("locker.mode", ref.Mode))
	if o.cfg.withName {
		kv = append(kv, attribute.String("locker.name", ref.Name))
	}
	return metric.WithAttributes(append(kv, extra...)...)
}

// spanAttrs describe ref on a span.
func spanAttrs(ref locker.LockRef) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String("locker.name", ref.Name),
		attribute.String("locker.namespace", ref.Namespace),
	}
	if ref.Owner != "" {
		kv = append(kv, attribute.String("locker.owner", ref.Owner))
	}
	if ref.Mode != "" {
		kv = append(kv, attribute.String("locker.mode", ref.Mode))
	}
	if ref.Limit != 0 {
		kv = append(kv, attribute.Int("locker.limit", ref.Limit))
	}
	return kv
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, locker.ErrNotAcquired):
		return "refused"
	default:
		return "failed"
	}
}

func (o *observer) acquireStart(ctx context.Context, e locker.AcquireStartEvent) context.Context {
	ctx, _ = o.tracer.Start(ctx, "locker.acquire", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(spanAttrs(e.LockRef), attribute.Bool("locker.wait", e.Wait))...))
	return ctx
}

func (o *observer) acquireDone(ctx context.Context, e locker.AcquireDoneEvent) {
	out := outcome(e.Err)
	o.ins.acquire.Record(ctx, e.Waited.Seconds(), o.attrs(e.LockRef,
		attribute.Bool("locker.wait", e.Wait), attribute.String("locker.outcome", out)))
	if e.Contended {
		o.ins.contention.Add(ctx, 1, o.attrs(e.LockRef))
	}
	if e.Err == nil && e.Woken != locker.WakeReentry {
		o.ins.held.Add(ctx, 1, o.attrs(e.LockRef))
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(
		attribute.String("locker.outcome", out),
		attribute.Int("locker.attempts", e.Attempts),
		attribute.Bool("locker.contended", e.Contended),
	)
	if e.Err == nil {
		span.SetAttributes(attribute.Int64("locker.fence", int64(e.Fence)), attribute.String("locker.woken", e.Woken.String()))
	} else if out == "failed" {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End()
}

func (o *observer) doStart(ctx context.Context, e locker.DoStartEvent) context.Context {
	ctx, _ = o.tracer.Start(ctx, "locker.do", trace.WithAttributes(spanAttrs(e.LockRef)...))
	return ctx
}

func (o *observer) doDone(ctx context.Context, e locker.DoDoneEvent) {
	span := trace.SpanFromContext(ctx)
	if e.Fence != 0 {
		span.SetAttributes(attribute.Int64("locker.fence", int64(e.Fence)))
	}
	if e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End()
}

func (o *observer) refreshed(e locker.RefreshEvent) {
	if e.Err == nil {
		return
	}
	kind := "transient"
	if errors.Is(e.Err, locker.ErrNotHeld) {
		kind = "lost"
	}
	o.ins.refreshFail.Add(context.Background(), 1, o.attrs(e.LockRef, attribute.String("locker.refresh.outcome", kind)))
}

func (o *observer) lostLock(e locker.LostEvent) {
	ctx := context.Background()
	o.ins.lost.Add(ctx, 1, o.attrs(e.LockRef, attribute.String("locker.lost.cause", e.Cause.String())))
	o.ins.held.Add(ctx, -1, o.attrs(e.LockRef))
	o.ins.hold.Record(ctx, e.Held.Seconds(), o.attrs(e.LockRef, attribute.String("locker.outcome", "lost")))
}

func (o *observer) released(e locker.ReleaseEvent) {
	if errors.Is(e.Err, locker.ErrLost) {
		return // counted when it was lost
	}
	ctx := context.Background()
	o.ins.held.Add(ctx, -1, o.attrs(e.LockRef))
	o.ins.hold.Record(ctx, e.Held.Seconds(), o.attrs(e.LockRef, attribute.String("locker.outcome", "released")))
}

func (o *observer) storeError(e locker.StoreErrorEvent) {
	o.ins.err.Add(context.Background(), 1, o.attrs(e.LockRef,
		attribute.String("locker.operation", e.Op), attribute.Bool("locker.retrying", e.Retrying)))
}
