package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/testenv"
)

// harness runs the conformance suite against one memcached server.
type harness struct{ addr string }

func (h harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	// The suite asks for TTLs up to 720h, which a server that started less
	// than 720h ago refuses for new names by default (restart.go): cap the
	// delay at a second, which the shared server has run for.
	return Open(ctx, "memcache://"+h.addr+"?restart_delay=1s")
}

// Expire deletes the lock's item, as an eviction or a restart would.
func (h harness) Expire(_ context.Context, key string) error {
	mc := memcache.New(h.addr)
	defer mc.Close()
	if err := mc.Delete(lockKey(key)); err != nil {
		if errors.Is(err, memcache.ErrCacheMiss) {
			return fmt.Errorf("no lock on %q to expire", key)
		}
		return err
	}
	return nil
}

// Entries counts the items of key: memcached keeps no per-waiter entries,
// so this is the lock's own item (a tombstone counts too), or nothing. It
// lets the suite check that failed and cancelled acquisitions leave nothing
// and that a release removes the item.
func (h harness) Entries(_ context.Context, key string) (int, error) {
	mc := memcache.New(h.addr)
	defer mc.Close()
	_, err := mc.Get(lockKey(key))
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return 1, nil
}

func (h harness) Traits() conformance.Traits {
	// memcached counts whole seconds, and frees a lock up to two seconds
	// after its TTL (see expirationMargin).
	return conformance.Traits{TTL: time.Second, Granularity: expirationMargin * time.Second}
}

func TestConformance(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	conformance.Run(t, harness{addr: testenv.MemcacheAddr()})
}
