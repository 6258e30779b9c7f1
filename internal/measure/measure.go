// Package measure holds the drivers' measurement hooks, which exist for
// internal/bench (and lockctl bench) only, out of the drivers' API: a
// driver package registers, at init, functions of its own driver type, and
// the benchmarks look them up by a driver's dynamic type. The hooks run on
// the driver's own connections, as its locks do, which is what makes a
// lock's cost comparable with its raw floor. The package imports only the
// standard library, so that every driver can import it and bench's tests
// can import the drivers.
package measure

import (
	"context"
	"reflect"
)

// Written by init functions only, read after.
var (
	floors = map[reflect.Type]func(any) func(context.Context, string) error{}
	tries  = map[reflect.Type]func(any) func() uint64{}
)

// RegisterRawFloor records the raw floor of drivers of type D (a concrete
// type, as a driver's dynamic type is): the bare store operations any
// lock's acquire+release costs at least, on the driver's own connections
// (for example Redis: SET key NX PX, then a compare-and-delete script;
// PostgreSQL: INSERT … ON CONFLICT DO NOTHING, then DELETE; memcached: add,
// then delete; etcd: the put-if-absent Txn and delete of
// concurrency.Mutex; ZooKeeper: create and delete an ephemeral node). The
// floor leaves nothing behind, and its key is never a lock's key. Call it
// from an init function.
func RegisterRawFloor[D any](f func(d D, ctx context.Context, key string) error) {
	floors[reflect.TypeFor[D]()] = func(d any) func(context.Context, string) error {
		dd := d.(D)
		return func(ctx context.Context, key string) error { return f(dd, ctx, key) }
	}
}

// RegisterStoreTries records the tries count of drivers of type D (a
// concrete type) that wait in their own queue: the attempts to take a lock
// that the driver's waiting sent to the store since it opened (every
// request that could grant a waiting acquisition, first tries included),
// so that the scale workload can show whether a release wakes O(1) waiters
// or all of them (a herd) as the waiters grow. A driver whose waiters are
// woken one by one by the store (a watch on the predecessor) counts the
// requests those wake-ups make. Call it from an init function.
func RegisterStoreTries[D any](f func(d D) uint64) {
	tries[reflect.TypeFor[D]()] = func(d any) func() uint64 {
		dd := d.(D)
		return func() uint64 { return f(dd) }
	}
}

// RawFloor returns d's raw floor, if d's type registered one.
func RawFloor(d any) (func(ctx context.Context, key string) error, bool) {
	bind, ok := floors[reflect.TypeOf(d)]
	if !ok {
		return nil, false
	}
	return bind(d), true
}

// StoreTries returns d's tries count, if d's type registered one.
func StoreTries(d any) (func() uint64, bool) {
	bind, ok := tries[reflect.TypeOf(d)]
	if !ok {
		return nil, false
	}
	return bind(d), true
}
