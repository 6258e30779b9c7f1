// Package fencetest tests the guards of package fenced and its subpackages
// on their real stores, written once for all: a guard's test only says how
// to write through it to a resource, and around it, and how to read back
// what the resource accepted. The resource's accepted writes are judged
// by history.CheckWrites.
package fencetest

import (
	"context"
	"testing"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/history"
)

// Store is one resource of a guarded store.
type Store interface {
	// Write records a write by who (unique in the test) with fence in the
	// resource, through the guard, or around it if bypass. A write the
	// guard refuses returns an error wrapping fenced.ErrStale.
	Write(ctx context.Context, who string, fence uint64, bypass bool) error
	// Writes lists the resource's writes in the order it accepted them.
	Writes(ctx context.Context) ([]history.Write, error)
}

// Open opens resource id of a store, creating it when missing; dir is a
// directory for a store that lives in files. drop removes the resource:
// the test calls it, a child process of the test does not.
type Open func(ctx context.Context, id, dir string) (s Store, drop func(), err error)

// resource is the lock name every holder of a test takes.
const resource = "account"

// client is a Client on d, closed at the end of the test.
func client(t testing.TB, d backend.Driver, err error) *locker.Client {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// open opens a new resource for the test, dropped at its end.
func open(ctx context.Context, t *testing.T, o Open, id, dir string) Store {
	t.Helper()
	s, drop, err := o(ctx, id, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return s
}
