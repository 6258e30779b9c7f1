package measure_test

import (
	"runtime"
	"slices"
	"testing"

	"github.com/lockerhq/locker/etcdlock"
	"github.com/lockerhq/locker/filelock"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/memcachelock"
	"github.com/lockerhq/locker/memlock"
	"github.com/lockerhq/locker/redislock"
	"github.com/lockerhq/locker/sqllock"
	"github.com/lockerhq/locker/zklock"
)

// Every driver registers its hooks (the benchmarks would otherwise report
// it without a floor, or count its tries at the Client), looked up by
// type only: the drivers here are never used.
func TestRegistered(t *testing.T) {
	// filelock's floor takes flock(2) (floor.go); it queues waiters, and
	// counts their tries, on Linux only.
	flock := slices.Contains([]string{"linux", "darwin", "freebsd", "netbsd", "openbsd", "dragonfly"}, runtime.GOOS)
	for _, c := range []struct {
		d            any
		floor, tries bool
	}{
		{new(redislock.Driver), true, true},
		{new(redislock.FairDriver), true, true},
		{new(redislock.Quorum), true, false},
		{new(etcdlock.Driver), true, true},
		{new(zklock.Driver), true, true},
		{new(sqllock.Driver), true, false},      // every try reaches the store: the Client counts them
		{new(memcachelock.Driver), true, false}, // every try reaches the store: the Client counts them
		{new(filelock.Driver), flock, runtime.GOOS == "linux"},
		{new(memlock.Driver), true, false},
		{nil, false, false},
	} {
		_, floor := measure.RawFloor(c.d)
		_, tries := measure.StoreTries(c.d)
		if floor != c.floor || tries != c.tries {
			t.Errorf("%T: raw floor %v, store tries %v; want %v, %v", c.d, floor, tries, c.floor, c.tries)
		}
	}
}
