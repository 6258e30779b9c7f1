package bench

import "github.com/lockerhq/locker/backend"

// hook returns the measurement hook (internal/measure) that of finds for
// drv or, through Unwrap, for a driver it wraps: where backend.As finds an
// optional interface.
func hook[F any](drv backend.Driver, of func(any) (F, bool)) (F, bool) {
	for range 64 { // bounded, as backend.As is
		if f, ok := of(drv); ok || drv == nil {
			return f, ok
		}
		w, ok := drv.(backend.Wrapper)
		if !ok {
			break
		}
		drv = w.Unwrap()
	}
	var zero F
	return zero, false
}
