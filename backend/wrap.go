package backend

// Wrapper is implemented by a driver that wraps another (for metrics,
// tracing, fault injection): Unwrap returns the wrapped driver. The locker
// Client finds the optional interfaces (Queuer, Notifier, Session,
// BatchRefresher) with As, so a wrapper that embeds the driver it wraps
// keeps them without implementing each; calls through them then go to the
// wrapped driver directly. A wrapper that must see those calls too
// implements the interface itself, and As finds it first.
type Wrapper interface {
	Driver
	Unwrap() Driver
}

// As returns the first driver of d's chain (d, then what each Unwrap
// returns) that implements T, as errors.As does for errors.
func As[T any](d Driver) (T, bool) {
	// Bounded, in case a chain loops back on itself.
	for range 64 {
		if d == nil {
			break
		}
		if t, ok := any(d).(T); ok {
			return t, true
		}
		w, ok := d.(Wrapper)
		if !ok {
			break
		}
		d = w.Unwrap()
	}
	var zero T
	return zero, false
}
