package conformance_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/memlock"
)

// memHarness is how an outside backend joins the suite: a few lines that
// open independent drivers on one store and take a lock away from it.
type memHarness struct{ store *memlock.Store }

func (h memHarness) NewDriver(context.Context) (backend.Driver, error) {
	return memlock.New(h.store)
}

func (h memHarness) Expire(_ context.Context, key string) error {
	if !h.store.Expire(key) {
		return fmt.Errorf("no lock on %q to expire", key)
	}
	return nil
}

// Residue lets the suite check that a released name leaves nothing behind.
func (h memHarness) Residue(_ context.Context, key string) (int, error) {
	if h.store.Keeps(key) {
		return 1, nil
	}
	return 0, nil
}

func (h memHarness) Traits() conformance.Traits {
	return conformance.Traits{} // exact expiry; the default TTL suits it
}

// fairHarness is memHarness whose drivers queue waiters (backend.Queuer).
type fairHarness struct{ memHarness }

func (h fairHarness) NewDriver(context.Context) (backend.Driver, error) {
	return memlock.NewFair(h.store)
}

func (h fairHarness) Traits() conformance.Traits {
	return conformance.Traits{FIFO: backend.Modes(backend.Exclusive, backend.Permit)}
}

// TestMemFairBackend runs the suite against memlock's queue.
func TestMemFairBackend(t *testing.T) {
	conformance.Run(t, fairHarness{memHarness{store: memlock.NewStore()}})
}

// TestMemBackend runs the whole suite against the in-memory backend, as a
// third party's test would against its own.
func TestMemBackend(t *testing.T) {
	conformance.Run(t, memHarness{store: memlock.NewStore()})
}

// A backend joins the suite from its own test file, with its harness.
// Run needs the test's *testing.T, so this example is compiled, not run.
func ExampleRun() {
	_ = func(t *testing.T) {
		conformance.Run(t, memHarness{store: memlock.NewStore()})
	}
}
