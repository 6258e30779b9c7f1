// Package otellocker reports a locker.Client's events to OpenTelemetry:
// metrics in the style of OpenTelemetry's semantic conventions, and spans
// for acquisitions and for Do.
//
// It is a module of its own, so that programs that use locker without it
// do not depend on OpenTelemetry.
//
//	obs, err := otellocker.New() // the global MeterProvider and TracerProvider
//	client, err := locker.Open(ctx, url, locker.WithObserver(obs))
//
// Metrics (attributes in brackets, each with locker.mode too: exclusive,
// read, write or permit; lock names are left out by default,
// since a service that locks per entity would make one series per entity:
// see WithNameAttribute):
//
//	locker.acquire.duration  histogram, s   [locker.namespace, locker.wait, locker.outcome = granted|refused|failed]
//	locker.hold.duration     histogram, s   [locker.namespace, locker.outcome = released|lost]
//	locker.held              up-down counter [locker.namespace]: locks this process holds
//	locker.contention        counter        [locker.namespace]: acquisitions that found the lock held
//	locker.lost              counter        [locker.namespace, locker.lost.cause = gone|expired|reported|closed]
//	locker.refresh.failures  counter        [locker.namespace, locker.refresh.outcome = transient|lost]
//	locker.store.errors      counter        [locker.namespace, locker.operation, locker.retrying]
//
// Spans: "locker.acquire" from the start of an Acquire or TryAcquire to
// its answer, and "locker.do" around Do, under which the acquisition's
// span and fn's own spans nest. Both carry locker.name, locker.namespace,
// locker.mode, locker.limit (a semaphore's), locker.owner (when set) and
// locker.fence; a failed acquisition or Do
// sets the span's status to Error, a refusal does not (it is an answer).
package otellocker
